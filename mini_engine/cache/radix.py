"""The hybrid radix tree: shared KV pages plus linear-state snapshots, evicted by two LRUs.

A node owns a page-aligned token span, one KV page id per page, and optionally a snapshot slot with
the GDN state at the END of its span (``None``: tombstone), only at depths that are multiples of
``snapshot_align``. A hybrid model resumes only from a snapshot, so ``match`` truncates to the
deepest one on the path. Child keys include the ``extra_key`` (media digest, model id), so different
extra keys never share a node. ``lock(node)`` puts a full lock on every node root..node (pages stay)
and a snapshot lock on ``node`` (being restored); nothing locked is evicted. Tombstone leaves are
legal but unmatchable, so every ``evict()`` drops the unlocked ones first. The tree never allocates
or frees ids, it hands them back. Not thread-safe: only the scheduler thread (or its lock holder).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

from mini_engine.cache.radix_integrity import TreeIntegrityError, check_tree
from mini_engine.constants import SNAPSHOT_ALIGN

__all__ = ["SNAPSHOT_ALIGN", "EvictResult", "InsertResult", "MatchResult", "RadixNode", "RadixTree",
           "TreeIntegrityError"]

ChildKey = tuple[str, tuple[int, ...]]  # (extra_key, first page of the child's span)


@dataclass(eq=False, repr=False)
class RadixNode:
    """One span of the tree. Callers may read it and hand it to lock/unlock; only the tree mutates it."""

    node_id: int
    extra_key: str
    tokens: tuple[int, ...]
    page_ids: tuple[int, ...]
    parent: RadixNode | None = None
    snapshot_slot: int | None = None
    children: dict[ChildKey, RadixNode] = field(default_factory=dict)
    full_lock: int = 0
    snapshot_lock: int = 0
    full_stamp: int = 0
    snapshot_stamp: int = 0

    def __repr__(self) -> str:
        return (f"RadixNode(#{self.node_id}, key={self.extra_key!r}, tokens={len(self.tokens)}, "
                f"slot={self.snapshot_slot}, locks full={self.full_lock} snapshot={self.snapshot_lock})")


class MatchResult(NamedTuple):
    """The usable cached prefix: ``node`` ends exactly at ``cached_len`` and holds ``snapshot_slot``."""

    node: RadixNode  # the root when nothing is usable
    cached_len: int
    page_ids: tuple[int, ...]  # cached_len // page_size pages, root first
    snapshot_slot: int | None  # None only when node is the root


class InsertResult(NamedTuple):
    """What the tree kept from an insert and what the caller must free."""

    node: RadixNode  # ends at len(tokens) (the root for an empty insert)
    new_pages: tuple[int, ...]  # now owned by the tree
    duplicate_pages: tuple[int, ...]  # the tree already had that span: the caller frees these
    snapshot_stored: bool  # False: the caller still owns (and frees) its snapshot_slot
    displaced_slot: int | None  # replace_snapshot only: the tree's old slot, now the caller's to free


class EvictResult(NamedTuple):
    """Everything one evict() call gave back; the caller frees these ids in its pools."""

    freed_pages: tuple[int, ...]
    freed_slots: tuple[int, ...]
    removed_nodes: int
    tombstoned_nodes: int
    locked_slots: tuple[int, ...] = ()  # respect_snapshot_locks=False only: slots taken from locked nodes


@dataclass
class _Freed:
    pages: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    removed: int = 0
    tombstoned: int = 0
    locked_slots: list[int] = field(default_factory=list)


class _Walk(NamedTuple):
    nodes: tuple[RadixNode, ...]  # fully matched nodes below the root, in path order
    partial: RadixNode | None  # the node the match ends strictly inside, if any
    partial_pages: int  # whole pages matched inside `partial` (>= 1 when partial is set)


class RadixTree:
    """Hybrid radix tree of KV pages and snapshot slots (see the module docstring).

    Every method assumes the caller holds the scheduler's lock (the tree is not thread-safe); each
    docstring says whether it mutates and what it raises.
    """

    def __init__(self, page_size: int, snapshot_align: int = SNAPSHOT_ALIGN):
        if type(page_size) is not int or page_size < 1 or SNAPSHOT_ALIGN % page_size:
            raise ValueError(f"page_size={page_size!r} must divide {SNAPSHOT_ALIGN} "
                             "(allowed: 1, 2, 4, 8, 16, 32, 64)")
        if type(snapshot_align) is not int or snapshot_align < 1 or snapshot_align % page_size:
            raise ValueError(f"snapshot_align={snapshot_align!r} must be a positive multiple of "
                             f"page_size={page_size} so snapshots sit on page boundaries")
        self.page_size, self.snapshot_align = page_size, snapshot_align
        self._root = RadixNode(node_id=0, extra_key="", tokens=(), page_ids=())
        self._clock, self._next_id, self._locks_outstanding = 0, 1, 0
        self._page_node: dict[int, RadixNode] = {}
        self._slot_node: dict[int, RadixNode] = {}

    @property
    def root(self) -> RadixNode:
        """The root: empty span, never holds pages, a snapshot or locks; never evicted. Pure."""
        return self._root

    def tick(self) -> int:
        """Advance the logical LRU clock and return the new time. Mutates; match/insert call it."""
        self._clock += 1
        return self._clock

    def match(self, tokens: Sequence[int], extra_key: str) -> MatchResult:
        """The longest cached prefix a hybrid model can resume from. Mutates LRU stamps only.

        Walks whole pages, then truncates to the deepest node on the path holding a snapshot. Never
        splits: a snapshot sits at a node's END, so the result always ends on a node boundary, and a
        split at the raw match end would only make a tombstone that truncation discards. Does not
        lock (call lock(node) next). To compute >= 1 token, pass tokens[:-1]. Raises nothing.

            tokens  |------------------------------------------------- len ---|
            walk    |== n1 ==|===== n2 =====|== n3 ==|== n4 (partial) ==|
            snaps            S                       S                     (S: slot at node end)
            cached  |<----------- cached_len ------->|   -> node n3
        """
        walk = self._walk(tuple(tokens), extra_key)
        holders = [i for i, node in enumerate(walk.nodes) if node.snapshot_slot is not None]
        kept = walk.nodes[: holders[-1] + 1] if holders else ()
        now = self.tick()
        for node in kept:
            node.full_stamp = now
        end = kept[-1] if kept else self._root
        if kept:
            end.snapshot_stamp = now
        pages = tuple(chain.from_iterable(node.page_ids for node in kept))
        return MatchResult(end, len(pages) * self.page_size, pages, end.snapshot_slot)

    def _walk(self, tokens: tuple[int, ...], extra_key: str) -> _Walk:
        """Follow whole matching pages from the root. Pure."""
        limit = len(tokens) - len(tokens) % self.page_size
        node, nodes, matched = self._root, [], 0
        while matched < limit:
            child = node.children.get(self._key(extra_key, tokens, matched))
            if child is None:
                break
            pages = self._common_pages(child, tokens, matched, limit)
            if pages * self.page_size < len(child.tokens):
                return _Walk(tuple(nodes), child, pages)
            nodes.append(child)
            matched += len(child.tokens)
            node = child
        return _Walk(tuple(nodes), None, 0)

    def _common_pages(self, node: RadixNode, tokens: tuple[int, ...], start: int, limit: int) -> int:
        """Whole pages of ``node``'s span equal to tokens[start:limit]. Pure."""
        size, span = self.page_size, min(len(node.tokens), limit - start)
        for offset in range(0, span, size):
            if node.tokens[offset : offset + size] != tokens[start + offset : start + offset + size]:
                return offset // size
        return span // size

    def _key(self, extra_key: str, tokens: tuple[int, ...], start: int = 0) -> ChildKey:
        return extra_key, tuple(tokens[start : start + self.page_size])

    def _key_of(self, node: RadixNode) -> ChildKey:
        return self._key(node.extra_key, node.tokens)

    def insert(self, tokens: Sequence[int], extra_key: str, page_ids: Sequence[int],
               snapshot_slot: int | None = None, replace_snapshot: bool = False) -> InsertResult:
        """Cache a page-aligned sequence and its pages, optionally a snapshot at its end. Mutates.

        Where the tree has the span already, the caller's differing page ids come back in
        ``duplicate_pages`` (ids equal to the tree's own, e.g. from a match, are in neither list);
        the rest become ``new_pages``. May split one node at the divergence page. If the end node
        already has a snapshot the tree keeps it by default — it may be in use, and both states are
        the same prefix's — so ``snapshot_stored=False`` and the caller frees its slot; with
        ``replace_snapshot`` an unlocked one is swapped out and returned as ``displaced_slot``.
        Touches the path's LRU stamps; does not lock. Raises ValueError, changing nothing, on
        misaligned lengths, a page the tree owns at another position, or a slot the tree holds.
        """
        tokens, page_ids = tuple(tokens), tuple(page_ids)
        self._check_insert_args(tokens, page_ids, snapshot_slot)
        walk = self._walk(tokens, extra_key)
        tree_pages = self._walk_pages(walk)
        self._check_caller_pages(page_ids, tree_pages)
        end = walk.nodes[-1] if walk.nodes else self._root
        if walk.partial is not None:
            end = self._split(walk.partial, walk.partial_pages)
        new_pages = page_ids[len(tree_pages) :]
        if new_pages:
            end = self._add_leaf(end, extra_key, tokens[len(tree_pages) * self.page_size :], new_pages)
        now = self.tick()
        for node in self._path_to(end):
            node.full_stamp = now
        stored, displaced = self._attach_snapshot(end, snapshot_slot, replace_snapshot, now)
        duplicates = tuple(mine for mine, ours in zip(page_ids, tree_pages) if mine != ours)
        return InsertResult(end, new_pages, duplicates, stored, displaced)

    def _check_insert_args(self, tokens: tuple[int, ...], page_ids: tuple[int, ...],
                           snapshot_slot: int | None) -> None:
        """Raise ValueError naming the bad argument. Pure."""
        if len(tokens) % self.page_size or len(page_ids) != len(tokens) // self.page_size:
            raise ValueError(f"insert: len(tokens)={len(tokens)} must equal len(page_ids)={len(page_ids)}"
                             f" * page_size={self.page_size}; cache only whole pages")
        if len(set(page_ids)) != len(page_ids):
            raise ValueError(f"insert: page_ids {page_ids} name a page twice")
        if snapshot_slot is not None and (not tokens or len(tokens) % self.snapshot_align):
            raise ValueError(f"insert: a snapshot needs len(tokens)={len(tokens)} to be a positive multiple"
                             f" of snapshot_align={self.snapshot_align}; pass snapshot_slot=None")
        if snapshot_slot in self._slot_node:
            raise ValueError(f"insert: snapshot slot {snapshot_slot} is already held by "
                             f"{self._slot_node[snapshot_slot]!r}; a slot has one owner")

    def _check_caller_pages(self, page_ids: tuple[int, ...], tree_pages: tuple[int, ...]) -> None:
        """Raise ValueError if a caller page is owned by the tree at another position. Pure."""
        for index, page in enumerate(page_ids):
            owner = self._page_node.get(page)
            if owner is not None and (index >= len(tree_pages) or tree_pages[index] != page):
                raise ValueError(f"insert: page {page} (position {index}) is already owned by {owner!r} "
                                 "at another position; pass fresh pages or the tree's own")

    def _walk_pages(self, walk: _Walk) -> tuple[int, ...]:
        """The tree's page ids along a walk, partial node included. Pure."""
        pages = tuple(chain.from_iterable(node.page_ids for node in walk.nodes))
        return pages + (walk.partial.page_ids[: walk.partial_pages] if walk.partial else ())

    def _split(self, node: RadixNode, pages: int) -> RadixNode:
        """Cut ``node`` after ``pages`` whole pages; return the new upper node. Mutates.

            before:  parent ── node  [a ........................ b)
            after:   parent ── upper [a .. a+pages*P) ── node [a+pages*P .. b)

        The lower part keeps the node object (id, snapshot, snapshot lock, children): its snapshot
        is still at the END of its span and request handles stay valid. The upper part inherits the
        full lock (every lock below passes through it) and the full stamp.
        """
        cut, parent = pages * self.page_size, node.parent
        upper = RadixNode(self._new_id(), node.extra_key, node.tokens[:cut], node.page_ids[:pages],
                          parent=parent, full_lock=node.full_lock, full_stamp=node.full_stamp)
        parent.children[self._key_of(upper)] = upper  # same first page: replaces `node`
        node.tokens, node.page_ids, node.parent = node.tokens[cut:], node.page_ids[pages:], upper
        upper.children[self._key_of(node)] = node
        self._page_node.update(dict.fromkeys(upper.page_ids, upper))
        return upper

    def _add_leaf(self, parent: RadixNode, extra_key: str, tokens: tuple[int, ...],
                  page_ids: tuple[int, ...]) -> RadixNode:
        """Hang a new tombstone leaf owning ``page_ids`` under ``parent``. Mutates."""
        leaf = RadixNode(self._new_id(), extra_key, tokens, page_ids, parent=parent)
        parent.children[self._key_of(leaf)] = leaf
        self._page_node.update(dict.fromkeys(page_ids, leaf))
        return leaf

    def _attach_snapshot(self, node: RadixNode, slot: int | None, replace: bool,
                         now: int) -> tuple[bool, int | None]:
        """Store ``slot`` at ``node`` per the insert policy; returns (stored, displaced). Mutates."""
        if slot is None:
            return False, None
        displaced = node.snapshot_slot
        if displaced is not None and not (replace and self._snapshot_droppable(node)):
            node.snapshot_stamp = now
            return False, None
        self._slot_node.pop(displaced, None)
        node.snapshot_slot, node.snapshot_stamp = slot, now
        self._slot_node[slot] = node
        return True, displaced

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def lock(self, node: RadixNode) -> None:
        """Pin ``node``'s path (full lock) and its snapshot (snapshot lock). Mutates.

        A tombstone may be locked (its pages stay; a snapshot attached later is pinned too). Locking
        the root is a no-op (never evicted). Raises ValueError if ``node`` is detached."""
        self._add_lock(node, 1)

    def unlock(self, node: RadixNode) -> None:
        """Undo one lock(node). Mutates. Raises ValueError on underflow or a detached node."""
        self._add_lock(node, -1)

    def _add_lock(self, node: RadixNode, delta: int) -> None:
        path = self._path_to(node)
        if path and node.snapshot_lock + delta < 0:
            raise ValueError(f"unlock underflow: {node!r} holds no lock; unlock only what lock() pinned")
        for step in path:
            step.full_lock += delta
        if path:
            node.snapshot_lock += delta
            self._locks_outstanding += delta

    def _path_to(self, node: RadixNode) -> list[RadixNode]:
        """Nodes from below the root down to ``node``. Pure. Raises ValueError if detached."""
        path = []
        while node is not self._root:
            parent = node.parent
            if parent is None or parent.children.get(self._key_of(node)) is not node:
                raise ValueError(f"{node!r} is not attached to this tree (evicted, or another tree's)")
            path.append(node)
            node = parent
        return path[::-1]

    def evict(self, pages_needed: int = 0, snapshots_needed: int = 0, *,
              respect_snapshot_locks: bool = True) -> EvictResult:
        """Free at least the asked pages / slots if possible and report what was freed. Mutates.

        (1) Every unlocked tombstone leaf goes, need or not (unmatchable waste). (2) Snapshot LRU:
        least-recently-used unlocked holders become tombstones if internal, are deleted if leaves.
        (3) Full LRU: least-recently-used unlocked leaves are deleted; a parent left a leaf joins the
        queue. Deleting a node deletes any ancestor it leaves as an unlocked tombstone leaf. A node
        with any lock is never touched; ties break by node id. Falls short silently when nothing
        more is evictable. Raises ValueError on a negative need only.

        ``respect_snapshot_locks=False`` is the fault ``evict_locked=on``: snapshot LRU also takes the
        slot of a locked node (leaving a locked tombstone, so lock accounting stays whole) and reports
        it in ``locked_slots``. Pages of locked nodes are still never touched.
        """
        if pages_needed < 0 or snapshots_needed < 0:
            raise ValueError(f"evict: pages_needed={pages_needed}, snapshots_needed={snapshots_needed} "
                             "must be >= 0")
        freed = _Freed()
        for leaf in [n for n in self._nodes() if self._prunable(n)]:
            self._remove_leaf(leaf, freed)  # cascades climb through ancestors, never a listed leaf
        self._evict_snapshots(snapshots_needed, freed, respect_snapshot_locks)
        self._evict_leaves(pages_needed, freed)
        return EvictResult(tuple(freed.pages), tuple(freed.slots), freed.removed, freed.tombstoned,
                           tuple(freed.locked_slots))

    def _evict_snapshots(self, needed: int, freed: _Freed, respect_locks: bool) -> None:
        """Snapshot LRU: tombstone internal (or, ignoring locks, locked) holders, delete leaf holders. Mutates."""
        heap = [(n.snapshot_stamp, n.node_id, n) for n in self._nodes()
                if n.snapshot_slot is not None and (self._snapshot_droppable(n) or not respect_locks)]
        heapq.heapify(heap)
        while heap and len(freed.slots) < needed:
            node = heapq.heappop(heap)[2]
            locked = not self._snapshot_droppable(node)
            if node.children or locked:
                freed.slots.append(self._take_slot(node))
                freed.tombstoned += 1
                if locked:
                    freed.locked_slots.append(freed.slots[-1])
            else:
                self._remove_leaf(node, freed)

    def _evict_leaves(self, needed: int, freed: _Freed) -> None:
        """Full LRU over unlocked leaves. Mutates."""
        heap = [(n.full_stamp, n.node_id, n) for n in self._nodes() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        while heap and len(freed.pages) < needed:
            survivor = self._remove_leaf(heapq.heappop(heap)[2], freed)
            if self._evictable_leaf(survivor):
                heapq.heappush(heap, (survivor.full_stamp, survivor.node_id, survivor))

    def _remove_leaf(self, node: RadixNode, freed: _Freed) -> RadixNode:
        """Delete an unlocked leaf and every ancestor it leaves as an unlocked tombstone leaf.

        Returns the first surviving ancestor. Mutates. The caller guarantees an unlocked leaf."""
        while True:
            parent, node.parent = node.parent, None
            del parent.children[self._key_of(node)]
            for page in node.page_ids:
                del self._page_node[page]
            freed.pages.extend(node.page_ids)
            if node.snapshot_slot is not None:
                freed.slots.append(self._take_slot(node))
            freed.removed += 1
            if not self._prunable(parent):
                return parent
            node = parent

    def _take_slot(self, node: RadixNode) -> int:
        """Detach ``node``'s snapshot (leaving a tombstone) and return the slot. Mutates."""
        slot, node.snapshot_slot = node.snapshot_slot, None
        del self._slot_node[slot]
        return slot

    def _evictable_leaf(self, node: RadixNode) -> bool:
        return node is not self._root and not node.children and node.full_lock == 0

    def _prunable(self, node: RadixNode) -> bool:
        """An unlocked tombstone leaf: it can never be matched, so it only wastes pages."""
        return self._evictable_leaf(node) and node.snapshot_slot is None

    @staticmethod
    def _snapshot_droppable(node: RadixNode) -> bool:
        """Nobody restores from it nor holds anything below it (conservative: both locks zero)."""
        return node.snapshot_lock == 0 and node.full_lock == 0

    def evictable_pages(self) -> int:
        """Pages evict() could free now: every node without a full lock (its subtree is unlocked). Pure."""
        return sum(len(n.page_ids) for n in self._nodes() if n.full_lock == 0)

    def evictable_snapshots(self) -> int:
        """Snapshot slots evict() could free now. Pure."""
        return sum(1 for n in self._nodes() if n.snapshot_slot is not None and self._snapshot_droppable(n))

    def total_pages(self) -> int:
        """Pages owned by the tree. Pure."""
        return len(self._page_node)

    def pages(self) -> dict[int, int]:
        """page id -> owning node id (a split moves a prefix's pages to the new upper node). Pure."""
        return {page: node.node_id for page, node in self._page_node.items()}

    def snapshot_slots(self) -> dict[int, int]:
        """slot -> owning node id (a split never changes a slot's node). Pure."""
        return {slot: node.node_id for slot, node in self._slot_node.items()}

    def _nodes(self) -> Iterator[RadixNode]:
        """Every node below the root, parents before children. Pure."""
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self) -> None:
        """Raise TreeIntegrityError naming the first broken invariant (see ``radix_integrity``). Pure."""
        check_tree(self)
