"""The hybrid cache manager: admission, restore, track-snapshot commits, finish donation, abort.

Lifecycle of a request's cache state (DESIGN.md §3)::

    admit:   match -> lock node -> alloc live + 2 ping-pong slots + pages -> clear live (cold)
    first forward built: restore the hit's snapshot into the live slot (the lock guards the gap)
    forward: each forward crossing a 64-boundary writes that state into the next ping-pong slot
    commit:  when that forward's results are processed, donate the snapshot (+ pages) to the tree
    finish:  donate the final snapshot, unlock, free what the request owns
    abort:   unlock, free everything, donate nothing that was not already committed

Donation policies: ``copy`` (the fix of the first seed) clones the ping-pong slot into a fresh tree
slot on the copy stream, behind the forward that wrote it; the request keeps its slots.
``transfer`` (the original design) hands the slot id itself to the tree and gives the request a
replacement; at finish the tree takes the *live* slot when the final length is a 64-multiple
(zero-copy) — a batch already built under overlap still names that id.

Faults (``mini_engine.faults``) switch single safeguards off here: the barriers
(``admission_barrier=off``), copy-on-donate (``donate=transfer``), page copy-on-write
(``page_cow=off``) and snapshot locks during eviction (``evict_locked=on``).

Barriers: restores and clears run on the compute stream, clones on the copy stream; every one of
them waits, through ``SlotFences``, for the other stream's last op on the slots it touches — so a
restore is ordered after every prior write to its source, and a clone after the forward that wrote
the snapshot it copies.
"""

from __future__ import annotations

from collections.abc import Callable

from mini_engine.cache import Owner, PagePool, RadixTree, SlotPool
from mini_engine.constants import SNAPSHOT_ALIGN
from mini_engine.device import Device, Stream
from mini_engine.engine.config import EngineConfig
from mini_engine.engine.fences import SlotFences
from mini_engine.engine.landing import DigestArena, lands_in_rows
from mini_engine.engine.request import Commit, Request, prefix_digest
from mini_engine.engine.storage import KVStorage, StateStorage
from mini_engine.instrument import Instrumentation, Later
from mini_engine.ops.checksum.deferred import DigestRows

__all__ = ["TREE_PAGES", "TREE_SLOTS", "CacheManager"]

TREE_PAGES = Owner("tree", 0, "kv")
TREE_SLOTS = Owner("tree", 0, "snapshot")


def _owner(request: Request, role: str) -> Owner:
    return Owner("request", request.rid, role)


class CacheManager:
    def __init__(self, config: EngineConfig, states: StateStorage, kv: KVStorage, device: Device, stream: Stream,
                 copy_stream: Stream, fences: SlotFences, instrumentation: Instrumentation) -> None:
        self.config = config
        self.slots = SlotPool(config.num_slots)
        self.pages = PagePool(config.num_pages, config.page_size)
        # Snapshots may sit at any page boundary (a chunk-exact slot carries its pending rows), though
        # track snapshots are only written at 64-multiples; transfer's finish donation uses the rest.
        self.tree = RadixTree(config.page_size, snapshot_align=config.page_size)
        self.states, self.device, self.stream, self.events = states, device, stream, instrumentation
        self.copy_stream, self.fences, self.kv = copy_stream, fences, kv
        self.evictions = 0
        self.clones = self.clone_bytes = 0  # copy-on-donate: slot copies queued, and the bytes they move
        self._restore_rec_off = "restore_rec=off" in config.faults
        self.reference_checksum = None  # (tokens, media) -> int; set by the engine when reference_states
        # () -> DigestRows | None: rows for the ledger's digests of a restore, landing with the next forward's
        # results (``ModelRunner.early_rows``; set by the engine); None: each copied back on its own
        self.early_rows: Callable[[], DigestRows | None] = lambda: None
        # the rows clones' ledger digests are taken from on CUDA (``_clone_rows``), blocks cut from rows made on the
        # copy stream
        self._clone_block: DigestRows | None = None
        self._clone_arena = DigestArena(device, copy_stream)
        self._clone_digest_rows = lands_in_rows(device, instrumentation)

    # -- admission ---------------------------------------------------------------------------
    def try_admit(self, request: Request) -> bool:
        """Match, lock, allocate (for the request and its unforked siblings); a hit's restore waits for
        its first forward (``restore_before_forward``), a cold live slot is cleared now.

        All or nothing: False, holding nothing, when slots or pages are short even after eviction.
        The matched node is locked *before* evicting, so eviction can never take the hit away.
        """
        match = self._match(request)
        group = [request, *request.children]
        shared = self.pages.pages_for_tokens(request.fork_at or 0)  # pages the siblings take from the parent
        own = [self.pages.pages_for_tokens(len(r.prompt) + r.params.max_tokens) for r in group]
        new_pages = own[0] - len(match.page_ids) + sum(n - shared for n in own[1:])
        self.tree.lock(match.node)
        if not self._ensure(pages=new_pages, slots=3 * len(group)):
            self.tree.unlock(match.node)
            return False
        request.match_node, request.cached_len, request.restore_slot = match.node, match.cached_len, match.snapshot_slot
        for page in match.page_ids:
            self.pages.retain(page, _owner(request, "kv"))
        request.pages = list(match.page_ids) + list(self.pages.alloc(_owner(request, "kv"), own[0] - len(match.page_ids)))
        for member, pages in zip(group, own):
            member.live_slot = self._alloc_slot(_owner(member, "live"))
            member.pingpong = [self._alloc_slot(_owner(member, "pingpong")) for _ in range(2)]
            if member is not request:
                member.pages = [-1] * shared + list(self.pages.alloc(_owner(member, "kv"), pages - shared))
        request.scheduled_len = match.cached_len
        if request.restore_slot is None:
            self._clear(request.live_slot)  # a fresh live slot starts empty
        else:
            request.restore_pending = True  # restored when its first forward is built (restore_before_forward)
        return True

    def fork(self, parent: Request) -> list[Request]:
        """Give each unforked sibling the parent's state at ``fork_at``: a clone of its live slot and
        shared references to its pages (the last one possibly partial: copied before anyone writes it)."""
        children, parent.children = parent.children, []
        shared = self.pages.pages_for_tokens(parent.fork_at)
        for child in children:
            for i in range(shared):
                self.pages.retain(parent.pages[i], _owner(child, "kv"))
                child.pages[i] = parent.pages[i]
            touched = [parent.live_slot, child.live_slot]
            self.fences.before(self.stream, touched)
            src, dst = parent.live_slot, child.live_slot
            self.device.launch(self.stream, lambda s=src, d=dst, n=parent.fork_at: self.states.copy_slot(d, s, n), label=f"fork:{src}->{dst}")
            self.fences.after(self.stream, touched)
            child.scheduled_len, child.cached_len = parent.fork_at, parent.cached_len
            self.events.emit("fork", rid=child.rid, parent=parent.rid, src=src, dst=dst, position=parent.fork_at)
        return children

    def copy_on_write(self, request: Request, first: int, end: int) -> None:
        """Before a forward writes positions [first, end), give the request a private copy of every
        page there that someone else also holds (page copy-on-write)."""
        size = self.config.page_size
        for index in range(first // size, (end - 1) // size + 1):
            page = request.pages[index]
            if not self.pages.is_shared(page):
                continue
            if "page_cow=off" in self.config.faults:
                self.events.emit("fault", name="page_cow=off", site="write", rid=request.rid, page=page, index=index)
                self.events.emit("shared_page_write", rid=request.rid, page=page, index=index,
                                 holders=self.pages.refcount(page))
                continue
            (copy,) = self.pages.alloc(_owner(request, "kv"), 1) if self._ensure(pages=1, slots=0) else (None,)
            if copy is None:
                raise RuntimeError(f"no page left for copy-on-write of page {page} (request {request.rid}); "
                                   "admission reserves pages, so this is an accounting bug")
            self.device.launch(self.stream, lambda o=page, n=copy: self.kv.copy_page(n, o), label=f"cow:{page}->{copy}")
            self.pages.release(page, _owner(request, "kv"))
            request.pages[index] = copy
            self.events.emit("page_cow", rid=request.rid, old=page, new=copy, index=index)

    def _match(self, request: Request):
        if not self.config.enable_cache:
            return self.tree.match([], request.extra_key)
        return self.tree.match(request.prompt[:-1], request.extra_key)  # always compute >= 1 token

    def _clear(self, slot: int) -> None:
        self.fences.before(self.stream, [slot])
        self.device.launch(self.stream, lambda: self.states.clear_slot(slot), label=f"clear:{slot}")
        self.fences.after(self.stream, [slot])

    def restore_before_forward(self, request: Request) -> None:
        """Queue a hit's restore (snapshot -> live slot) ahead of its first forward, exactly once.

        Between admission and this call only the snapshot lock keeps the source slot from being
        evicted and reused (``evict_locked=on`` removes that); the barrier orders the copy after
        every prior write to the source, e.g. the donation clone that filled it."""
        if not request.restore_pending:
            return
        request.restore_pending = False
        live, source = request.live_slot, request.restore_slot
        self._barrier(self.stream, [live, source], site="restore", rid=request.rid)
        position, rid = request.cached_len, request.rid
        if self._restore_rec_off:
            self.events.emit("fault", name="restore_rec=off", site="restore", rid=rid, src=source, dst=live)
        into = self.early_rows()
        self.device.launch(self.stream, lambda: self._copy_reported("restore_read", live, source, position, rid=rid,
                                                                    into=into), label=f"restore:{source}->{live}")
        self.fences.after(self.stream, [live, source])
        if self.events.enabled:
            with self.events.timing():  # (the prefix digest at the flush: ``Later``)
                self.events.emit("restore", rid=rid, src=source, dst=live, position=position,
                                 node=request.match_node.node_id,
                                 prefix=Later(prefix_digest, request.extra_key, request.prompt[:position]))

    def _copy_reported(self, type_: str, dst: int, src: int, length: int, *, into: DigestRows | None = None,
                       **ids) -> None:
        """Device-side body of a restore or clone: copy, and (instrumented) report the checksum of the
        source as read and of the destination as written, at the moment the copy runs (on CUDA into ``into``'s
        rows when given)."""
        recurrent = not (type_ == "restore_read" and self._restore_rec_off)
        if not self.events.enabled:
            self.states.copy_slot(dst, src, length, recurrent=recurrent)
            return
        with self.events.timing():  # the copy too: on a GPU one launch copies and digests (copy_witnessed)
            read, written = self.states.copy_witnessed(dst, src, length, recurrent=recurrent, into=into)
            self.events.emit(type_, src=src, dst=dst, position=length, src_checksum=read, checksum=written, **ids)

    def _barrier(self, stream: Stream, slots: list[int], *, site: str, **ids) -> None:
        """The admission / donation barrier: ``stream``'s next op waits for the other streams' last
        ops on ``slots`` -- unless ``admission_barrier=off``, which records where a wait was skipped."""
        if "admission_barrier=off" not in self.config.faults:
            self.fences.before(stream, slots)
        elif self.fences.outstanding(stream, slots):
            self.events.emit("fault", name="admission_barrier=off", site=site, slots=list(slots), **ids)

    def _ensure(self, *, pages: int, slots: int) -> bool:
        """Evict from the tree until ``pages`` pages and ``slots`` slots are free; False if impossible."""
        short_pages = max(0, pages - self.pages.free_count)
        short_slots = max(0, slots - self.slots.free_count)
        if short_pages or short_slots:
            result = self.tree.evict(pages_needed=short_pages, snapshots_needed=short_slots,
                                     respect_snapshot_locks="evict_locked=on" not in self.config.faults)
            for slot in result.locked_slots:
                self.events.emit("fault", name="evict_locked=on", site="evict", slot=slot)
            self._release_tree(result.freed_pages, result.freed_slots)
        return self.pages.free_count >= pages and self.slots.free_count >= slots

    def _release_tree(self, pages, slots) -> None:
        for page in pages:
            self.pages.release(page, TREE_PAGES)
        for slot in slots:
            self._free_slot(slot, TREE_SLOTS)
        if pages or slots:
            self.evictions += 1
            self.events.emit("evict", pages=list(pages), slots=list(slots))

    # -- forwards ----------------------------------------------------------------------------
    def track_target(self, request: Request, start: int, length: int, *, prefill: bool) -> Commit | None:
        """The ping-pong slot a forward over [start, start+length) writes its deepest 64-boundary into.

        ``copy`` tracks decode steps too, so the decoded part of a sequence reaches the tree through
        processed snapshots only. ``transfer`` (the original design) tracks prefill chunks only and
        hands the decoded state over at finish, by giving the tree the live slot itself."""
        deepest = (start + length) // SNAPSHOT_ALIGN * SNAPSHOT_ALIGN
        if deepest <= start or (not prefill and self.config.donate_policy == "transfer"):
            return None
        slot = request.pingpong[request.next_pingpong]
        request.next_pingpong ^= 1
        return Commit(deepest, slot)

    # -- donation ----------------------------------------------------------------------------
    def commit(self, request: Request, commit: Commit) -> None:
        """Donate a processed track snapshot and the pages before it to the tree."""
        request.last_commit = commit
        if not self.config.enable_cache:
            return
        tokens = request.tokens()[: commit.position]
        if self.tree.match(tokens, request.extra_key).cached_len == commit.position:
            return  # the tree has this snapshot already
        if self.config.donate_policy == "copy":
            self._donate(request, tokens, self._clone(commit.slot, commit.position))
        else:
            self._donate_transfer(request, tokens, commit.slot, "pingpong")

    def _clone(self, source: int, length: int) -> int | None:
        if not self._ensure(pages=0, slots=1):
            return None
        clone = self._alloc_slot(TREE_SLOTS)
        self._barrier(self.copy_stream, [source, clone], site="clone", src=source, dst=clone)
        rows = self._clone_rows()
        self.device.launch(self.copy_stream, lambda: self._copy_reported("clone_written", clone, source, length,
                                                                         into=rows), label=f"clone:{source}->{clone}")
        if rows is not None:  # its two digests to the host right behind it: they land with its fence
            with self.events.timing():
                taken = rows.taken
                self.device.copy(self.copy_stream, rows.host[taken - 2: taken], rows.device[taken - 2: taken],
                                 label=f"clone_digests:{clone}")
        done = self.fences.after(self.copy_stream, [source, clone])
        if rows is not None:
            rows.landing.done = done
        self.clones += 1
        self.clone_bytes += self.states.nbytes(length)
        self.events.emit("clone", src=source, dst=clone)
        return clone

    def _clone_rows(self) -> DigestRows | None:
        """Two digest rows or more for a clone's ledger digests on CUDA: a block cut from rows made on the copy stream
        (``landing.DigestArena``), each clone's rows copied to the host behind it, landing with its fence
        (``landing.Landing``: the block's moves on with each clone, and is unset until the clone taking rows now has
        recorded it: asking then is an error, not a read of rows its copy has not reached). None off CUDA or without a
        sink."""
        if not self._clone_digest_rows:
            return None
        if self._clone_block is None or self._clone_block.left < 2:
            with self.events.timing():
                self._clone_block = self._clone_arena.block(_CLONE_ROWS)
        self._clone_block.landing.done = None
        return self._clone_block

    def _donate_transfer(self, request: Request, tokens: list[int], slot: int, role: str) -> None:
        """The original design: the tree takes ``slot`` itself. A ping-pong slot is replaced so the
        request can keep tracking; without a replacement the donation is skipped (never slot 0)."""
        owner = _owner(request, role)
        replacement = None
        if role == "pingpong":
            if not self._ensure(pages=0, slots=1):
                return
            replacement = self._alloc_slot(owner)
        self.slots.transfer(slot, owner, TREE_SLOTS)
        self.events.emit("transfer", rid=request.rid, slot=slot, role=role)
        self.events.emit("fault", name="donate=transfer", site="donate", rid=request.rid, slot=slot, role=role)
        self._donate(request, tokens, slot)
        if replacement is not None:
            request.pingpong[request.pingpong.index(slot)] = replacement

    def _donate(self, request: Request, tokens: list[int], slot: int | None) -> None:
        pages = request.pages[: len(tokens) // self.config.page_size]
        result = self.tree.insert(tokens, request.extra_key, pages, slot)
        for page in result.new_pages:
            self.pages.retain(page, TREE_PAGES)
        if slot is not None and not result.snapshot_stored:
            self._free_slot(slot, TREE_SLOTS)
        if not self.events.enabled:
            return
        with self.events.timing():  # the row's prefix digest at the flush (``Later``); with refs a cold forward
            prefix = Later(prefix_digest, request.extra_key, tokens)  # (``tokens``: a slice, nothing changes it)
            self.events.emit("donate", rid=request.rid, slot=slot, position=len(tokens), node=result.node.node_id,
                             prefix=prefix, stored=result.snapshot_stored, policy=self.config.donate_policy)
            if self.reference_checksum is not None:
                media = [m for p, m in zip(request.media_positions, request.media) if p < len(tokens)]
                self.events.emit("reference_state", prefix=prefix, position=len(tokens),
                                 checksum=self.reference_checksum(tokens, media))

    def finish(self, request: Request) -> None:
        """Donate the final state (``transfer`` only: the live slot, zero-copy, when the computed length
        is page-aligned), then release everything the request holds.

        The live slot holds the state of every token but the last sampled one. Under overlap a batch
        built before this finish may still feed that token into the live slot: with ``transfer`` it
        then writes into the tree's snapshot — the aliasing hazard. ``copy`` donates only processed
        track snapshots (at commit), so nothing in flight can reach the tree.
        """
        computed = request.total_len - 1
        if (self.config.enable_cache and self.config.donate_policy == "transfer"
                and computed and computed % self.config.page_size == 0):
            tokens = request.tokens()[:computed]
            if self.tree.match(tokens, request.extra_key).cached_len != computed:
                self._donate_transfer(request, tokens, request.live_slot, "live")
                request.live_slot = 0
        self.release(request)

    def release(self, request: Request) -> None:
        """Unlock and free everything the request owns (abort, or after finish donation). Donates nothing."""
        if request.match_node is not None:
            self.tree.unlock(request.match_node)
            request.match_node = None
        for slot in self.slots.slots_of("request", request.rid):
            self._free_slot(slot, self.slots.owner_of(slot))
        for page in self.pages.pages_of("request", request.rid):
            self.pages.release(page, _owner(request, "kv"))
        request.pages, request.pingpong, request.live_slot = [], [], 0

    def _alloc_slot(self, owner: Owner) -> int:
        slot = self.slots.alloc(owner)
        self.events.emit("alloc", slot=slot, owner=str(owner), role=owner.role)
        return slot

    def _free_slot(self, slot: int, owner: Owner) -> None:
        self.slots.free(slot, owner)
        self.events.emit("free", slot=slot, owner=str(owner), role=owner.role)
        if "free_unfenced=on" in self.config.faults and self.fences.forget(slot):
            self.events.emit("fault", name="free_unfenced=on", site="free", slot=slot)

    def check_integrity(self) -> None:
        """Pools, tree and their agreement: every tree page/slot is held by the tree owner."""
        self.tree.check_integrity()
        self.slots.check_integrity()
        self.pages.check_integrity()
        tree_slots = set(self.tree.snapshot_slots())
        owned = set(self.slots.slots_of("tree", 0))
        if tree_slots != owned:
            raise AssertionError(f"tree snapshot slots {sorted(tree_slots)} != slots owned by the tree {sorted(owned)}")
        tree_pages = set(self.tree.pages())
        held = set(self.pages.pages_of("tree", 0))
        if tree_pages != held:
            raise AssertionError(f"tree pages {sorted(tree_pages ^ held)} disagree with the page pool's tree holder")


_CLONE_ROWS = 32  # digest rows opened at a time for clones (sixteen clones)
