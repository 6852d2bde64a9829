"""The hybrid radix tree keeps its contracts: snapshot truncation, dedup, locks, two-LRU eviction, integrity."""

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mini_engine.cache.radix import RadixTree

from tests.unit.radix_support import depth, fresh, node_ids, put, toks


@pytest.mark.parametrize("args,field", [((0,), "page_size"), ((3,), "page_size"), ((48,), "page_size"),
                                        ((128,), "page_size"), (("16",), "page_size"),
                                        ((16, 40), "snapshot_align")])
def test_constructor_names_the_bad_field(args, field):
    """Page sizes must divide 64 and snapshot depths fall on page boundaries; errors name the field."""
    with pytest.raises(ValueError, match=field):
        RadixTree(*args)


def test_match_truncates_to_deepest_snapshot():
    """257 cached tokens cover 256 in pages; a prompt sharing 257 tokens resumes at the 256 snapshot."""
    tree, prompt = RadixTree(16), toks(257)
    ins = put(tree, prompt[:256], slot=7)
    hit = tree.match(prompt + toks(43, 5000), "")
    assert (hit.cached_len, hit.snapshot_slot, hit.node) == (256, 7, ins.node)
    assert hit.page_ids == ins.new_pages


def test_match_falls_back_to_shallower_snapshot():
    """With a snapshot only at 128, a 256-token cached path matches 128."""
    tree = RadixTree(16)
    put(tree, toks(128), slot=3)
    put(tree, toks(256))
    hit = tree.match(toks(300), "")
    assert (hit.cached_len, hit.snapshot_slot, len(hit.page_ids)) == (128, 3, 8)


def test_match_without_snapshot_returns_root():
    """Pages without any snapshot on the path are unusable: cached_len 0 at the root."""
    tree = RadixTree(16)
    assert tree.match(toks(100), "") == (tree.root, 0, (), None)
    put(tree, toks(128))
    assert tree.match(toks(200), "") == (tree.root, 0, (), None)


def test_match_never_splits_and_ignores_partial_page():
    """A raw match ending inside a node changes no structure; a partial last page never counts."""
    tree = RadixTree(16)
    put(tree, toks(64), slot=1)
    put(tree, toks(192), slot=2)
    before = node_ids(tree)
    assert tree.match(toks(150), "").cached_len == 64
    assert tree.match(toks(191), "").cached_len == 64
    assert node_ids(tree) == before


def test_match_stamps_path_and_clock_advances():
    """A match stamps the returned path with a fresh clock value (deterministic logical LRU)."""
    tree = RadixTree(16)
    first = put(tree, toks(64), slot=1).node
    second = put(tree, toks(128), slot=2).node
    hit = tree.match(toks(128), "")
    now = tree.tick() - 1
    assert hit.node is second and first.full_stamp == second.full_stamp == second.snapshot_stamp == now
    assert first.snapshot_stamp < now


def test_extra_key_isolation():
    """Identical tokens under different extra keys never share nodes, pages or snapshots."""
    tree = RadixTree(16)
    a = put(tree, toks(64), "media-a", slot=1)
    assert tree.match(toks(64), "media-b").cached_len == 0
    b = put(tree, toks(64), "media-b", slot=2)
    assert b.duplicate_pages == () and len(b.new_pages) == 4 and b.node is not a.node
    assert tree.match(toks(64), "media-b").snapshot_slot == 2
    assert tree.match(toks(64), "media-a").snapshot_slot == 1


def test_insert_returns_duplicate_pages():
    """Pages for a span the tree already has come back as duplicates; the rest are taken."""
    tree = RadixTree(16)
    first = put(tree, toks(128))
    mine = fresh(12)
    res = tree.insert(toks(192), "", mine)
    assert res.duplicate_pages == mine[:8] and res.new_pages == mine[8:]
    assert set(tree.pages()) == set(first.new_pages) | set(mine[8:])
    tree.check_integrity()


def test_insert_accepts_the_trees_own_pages():
    """Page ids a match handed out are neither new nor duplicate when inserted back."""
    tree = RadixTree(16)
    put(tree, toks(64), slot=1)
    hit = tree.match(toks(128), "")
    extra = fresh(4)
    res = tree.insert(toks(128), "", hit.page_ids + extra)
    assert res.duplicate_pages == () and res.new_pages == extra
    tree.check_integrity()


@pytest.mark.parametrize("tokens,pages,slot,message", [
    (toks(20), 1, None, "whole pages"),
    (toks(32), 3, None, "whole pages"),
    (toks(32), "repeat", None, "twice"),
    (toks(32), 2, 9, "snapshot_align"),
    (toks(64), 4, 1, "already held"),
    (toks(80), "owned", None, "another position"),
])
def test_insert_rejects_bad_arguments_and_changes_nothing(tokens, pages, slot, message):
    """Misaligned lengths, repeated or foreign-owned pages and held slots raise ValueError, tree unchanged."""
    tree = RadixTree(16)
    held = put(tree, toks(64), slot=1)
    page_ids = {"repeat": (5, 5), "owned": fresh(4) + held.new_pages[:1]}.get(pages) or fresh(pages)
    before = (tree.pages(), tree.snapshot_slots())
    with pytest.raises(ValueError, match=message):
        tree.insert(tokens, "", page_ids, slot)
    assert (tree.pages(), tree.snapshot_slots()) == before
    tree.check_integrity()


def test_split_keeps_snapshot_on_lower_node():
    """Splitting a node moves its prefix pages to a new upper node; id and snapshot stay on the lower part."""
    tree = RadixTree(16)
    a = put(tree, toks(128), slot=5)
    b = put(tree, toks(64) + toks(64, 500), slot=6)
    upper = a.node.parent
    assert upper is b.node.parent and upper.snapshot_slot is None and upper.node_id > a.node.node_id
    assert upper.page_ids == a.new_pages[:4] and a.node.page_ids == a.new_pages[4:]
    assert len(b.duplicate_pages) == len(b.new_pages) == 4
    assert tree.snapshot_slots() == {5: a.node.node_id, 6: b.node.node_id}
    assert {tree.pages()[p] for p in a.new_pages[:4]} == {upper.node_id}
    assert tree.match(toks(128), "").node is a.node


def test_split_of_locked_node_carries_full_lock():
    """A split under a lock gives the upper part the full lock and leaves unlock balanced."""
    tree = RadixTree(16)
    a = put(tree, toks(128), slot=5).node
    tree.lock(a)
    put(tree, toks(64) + toks(64, 500))
    assert (a.parent.full_lock, a.parent.snapshot_lock, a.full_lock, a.snapshot_lock) == (1, 0, 1, 1)
    tree.unlock(a)
    tree.check_integrity()
    assert a.parent.full_lock == a.full_lock == 0


def test_existing_snapshot_is_kept_unless_replaced_while_unlocked():
    """A second donation is refused by default; replace_snapshot swaps an unlocked snapshot, never a locked."""
    tree = RadixTree(16)
    node = put(tree, toks(64), slot=1).node
    res = put(tree, toks(64), slot=9)
    assert (res.snapshot_stored, res.displaced_slot, set(tree.snapshot_slots())) == (False, None, {1})
    res = put(tree, toks(64), slot=2, replace_snapshot=True)
    assert (res.snapshot_stored, res.displaced_slot, node.snapshot_slot) == (True, 1, 2)
    tree.lock(node)
    res = put(tree, toks(64), slot=3, replace_snapshot=True)
    assert (res.snapshot_stored, res.displaced_slot, node.snapshot_slot) == (False, None, 2)


def test_snapshot_fills_a_tombstone():
    """A tombstone at an aligned depth takes a donated snapshot (splitting where needed)."""
    tree = RadixTree(16)
    put(tree, toks(128))
    res = put(tree, toks(64), slot=4)
    assert res.snapshot_stored and res.new_pages == () and len(res.duplicate_pages) == 4
    assert tree.match(toks(128), "").cached_len == 64


def test_lock_counts_along_the_path():
    """lock adds a full lock on every node of the path and a snapshot lock on the target; unlock undoes it."""
    tree = RadixTree(16)
    n1 = put(tree, toks(64), slot=1).node
    n2 = put(tree, toks(128), slot=2).node
    tree.lock(n2)
    assert (n1.full_lock, n1.snapshot_lock, n2.full_lock, n2.snapshot_lock) == (1, 0, 1, 1)
    tree.lock(n1)
    assert (n1.full_lock, n1.snapshot_lock) == (2, 1)
    tree.check_integrity()
    tree.unlock(n1)
    tree.unlock(n2)
    assert (n1.full_lock, n1.snapshot_lock, n2.full_lock, n2.snapshot_lock) == (0, 0, 0, 0)
    with pytest.raises(ValueError, match="underflow"):
        tree.unlock(n2)
    tree.check_integrity()


def test_lock_root_is_noop_and_detached_nodes_are_refused():
    """The root needs no lock; a node already evicted cannot be locked."""
    tree = RadixTree(16)
    tree.lock(tree.root)
    tree.unlock(tree.root)
    gone = put(tree, toks(64), slot=1).node
    tree.evict(pages_needed=4)
    with pytest.raises(ValueError, match="not attached"):
        tree.lock(gone)
    tree.check_integrity()


def test_eviction_never_touches_locked_nodes():
    """Evicting everything leaves the locked path's pages and snapshot in place; negative needs raise."""
    tree = RadixTree(16)
    put(tree, toks(64, 100), slot=1)
    keep = put(tree, toks(128), slot=2)
    put(tree, toks(64) + toks(64, 900), slot=3)
    tree.lock(keep.node)
    protected = set(tree.match(toks(128), "").page_ids)
    res = tree.evict(pages_needed=10**6, snapshots_needed=10**6)
    assert not protected & set(res.freed_pages) and 2 not in res.freed_slots
    assert set(tree.pages()) == protected and set(tree.snapshot_slots()) == {2}
    assert tree.evictable_pages() == tree.evictable_snapshots() == 0
    assert tree.evict(10, 10) == ((), (), 0, 0, ())
    with pytest.raises(ValueError, match="pages_needed"):
        tree.evict(pages_needed=-1)
    tree.check_integrity()


def test_full_eviction_follows_lru_order():
    """Leaves go least-recently-used first; a match refreshes a leaf."""
    tree = RadixTree(16)
    a, b, c = (put(tree, toks(64, start), slot=slot).node for start, slot in ((0, 1), (100, 2), (200, 3)))
    tree.match(toks(64), "")
    order = [tree.evict(pages_needed=1).freed_slots for _ in range(3)]
    assert order == [(2,), (3,), (1,)]
    assert a.parent is b.parent is c.parent is None



def test_ignoring_snapshot_locks_takes_the_locked_slot_but_keeps_pages_and_locks():
    """respect_snapshot_locks=False (fault evict_locked=on) frees a locked node's slot, reports it, keeps
    its pages and its lock, and leaves a tree that still passes integrity and unlocks normally."""
    tree = RadixTree(16)
    keep = put(tree, toks(128), slot=2)
    tree.lock(keep.node)
    res = tree.evict(pages_needed=10**6, snapshots_needed=1, respect_snapshot_locks=False)
    assert res.freed_slots == (2,) and res.locked_slots == (2,)
    assert keep.node.snapshot_slot is None and set(tree.pages()) == set(keep.new_pages)
    assert tree.match(toks(128), "").cached_len == 0  # a tombstone: nobody else can hit it
    tree.check_integrity()
    tree.unlock(keep.node)
    tree.check_integrity()

def test_snapshot_eviction_tombstones_internal_and_deletes_leaves():
    """Snapshot LRU tombstones an internal holder (pages stay), deletes a leaf holder, prunes tombstones above."""
    tree = RadixTree(16)
    n1 = put(tree, toks(64), slot=1)
    n2 = put(tree, toks(128), slot=2)
    tree.match(toks(128), "")
    res = tree.evict(snapshots_needed=1)
    assert res == ((), (1,), 0, 1, ()) and n1.node.snapshot_slot is None
    assert tree.match(toks(128), "").cached_len == 128
    res = tree.evict(snapshots_needed=1)
    assert res == (n2.new_pages + n1.new_pages, (2,), 2, 0, ())
    assert tree.total_pages() == 0
    tree.check_integrity()


def test_eviction_prunes_unlocked_tombstone_leaves_only():
    """Unmatchable tombstone leaves go on any evict() call, unless a request holds them."""
    tree = RadixTree(16)
    dead = put(tree, toks(128))
    held = put(tree, toks(64, 300))
    tree.lock(held.node)
    res = tree.evict()
    assert res == (dead.new_pages, (), 1, 0, ())
    assert set(tree.pages()) == set(held.new_pages)


def test_full_eviction_reaches_parents_that_become_leaves():
    """Deleting a leaf makes its snapshot-holding parent an evictable leaf in the same call."""
    tree = RadixTree(16)
    n1 = put(tree, toks(64), slot=1)
    n2 = put(tree, toks(128), slot=2)
    res = tree.evict(pages_needed=8)
    assert res == (n2.new_pages + n1.new_pages, (2, 1), 2, 0, ())


def test_accounting_views_agree():
    """pages(), snapshot_slots(), total_pages() and the evictable counts describe the same tree."""
    tree = RadixTree(16)
    a = put(tree, toks(64), slot=1)
    b = put(tree, toks(128), slot=2)
    owners = {**dict.fromkeys(a.new_pages, a.node.node_id), **dict.fromkeys(b.new_pages, b.node.node_id)}
    assert tree.pages() == owners
    assert tree.snapshot_slots() == {1: a.node.node_id, 2: b.node.node_id}
    assert (tree.total_pages(), tree.evictable_pages(), tree.evictable_snapshots()) == (8, 8, 2)
    tree.lock(b.node)
    assert (tree.evictable_pages(), tree.evictable_snapshots()) == (0, 0)


P, ALIGN = 2, 4
DOCUMENTS = ((0,) * 16, (0,) * 8 + (1,) * 8, (0, 1) * 8, (1, 0, 0, 1) * 4)  # shared prefixes, so hits happen
token_lists = st.one_of(
    st.builds(lambda doc, n: list(doc[:n]), st.sampled_from(DOCUMENTS), st.integers(0, 16)),
    st.lists(st.integers(0, 1), max_size=14))
extra_keys = st.sampled_from(["", "m"])
rarely = st.integers(0, 3).map(lambda draw: draw == 0)  # locks pile up if taken on every other step


class RadixMachine(RuleBasedStateMachine):
    """Random inserts, matches, locks, unlocks and evictions keep integrity, conservation and the model."""

    def __init__(self):
        super().__init__()
        self.tree = RadixTree(P, snapshot_align=ALIGN)
        self.handed_pages, self.handed_slots = set(), set()
        self.returned_pages, self.returned_slots = Counter(), Counter()
        self.page_at, self.slot_at = {}, {}  # (extra_key, prefix) -> id caching that prefix's end
        self.locked = []

    @rule(tokens=token_lists, key=extra_keys, snap=st.booleans(), reuse=st.booleans(),
          replace=st.booleans(), lock=rarely)
    def insert(self, tokens, key, snap, reuse, replace, lock):
        tokens = tokens[: len(tokens) // (ALIGN if snap else P) * (ALIGN if snap else P)]
        slot = fresh(1)[0] if snap and tokens else None
        reused = self.tree.match(tokens, key).page_ids if reuse else ()
        mine = fresh(len(tokens) // P - len(reused))
        res = self.tree.insert(tokens, key, reused + mine, slot, replace_snapshot=replace)
        assert depth(res.node) == len(tokens)
        assert sorted(res.new_pages + res.duplicate_pages) == sorted(mine)
        self.handed_pages |= set(mine)
        self.returned_pages.update(res.duplicate_pages)
        for index, page in enumerate(reused + mine):
            if page in res.new_pages:
                self.page_at[key, tuple(tokens[: (index + 1) * P])] = page
        self._account_slot(key, tokens, slot, res)
        if lock:
            self.tree.lock(res.node)
            self.locked.append(res.node)

    @rule(doc=st.sampled_from(DOCUMENTS), boundaries=st.integers(1, 4), key=extra_keys)
    def donate(self, doc, boundaries, key):
        self.insert(list(doc[: boundaries * ALIGN]), key, snap=True, reuse=True, replace=False, lock=False)

    def _account_slot(self, key, tokens, slot, res):
        if slot is None:
            assert (res.snapshot_stored, res.displaced_slot) == (False, None)
            return
        self.handed_slots.add(slot)
        self.returned_slots.update([] if res.snapshot_stored else [slot])
        self.returned_slots.update([] if res.displaced_slot is None else [res.displaced_slot])
        if res.snapshot_stored:
            self.slot_at[key, tuple(tokens)] = slot

    @rule(tokens=token_lists, key=extra_keys, lock=rarely)
    def match(self, tokens, key, lock):
        hit = self.tree.match(tokens, key)
        aligned = len(tokens) // P * P
        depths = [d for d in range(ALIGN, aligned + 1, ALIGN) if (key, tuple(tokens[:d])) in self.slot_at]
        expected = max(depths, default=0)
        assert hit.cached_len == expected == depth(hit.node)
        assert hit.snapshot_slot == self.slot_at.get((key, tuple(tokens[:expected])))
        assert hit.page_ids == tuple(self.page_at[key, tuple(tokens[:end])]
                                     for end in range(P, expected + 1, P))
        if lock:
            self.tree.lock(hit.node)
            self.locked.append(hit.node)

    @precondition(lambda self: self.locked)
    @rule(data=st.data())
    def unlock(self, data):
        self.tree.unlock(self.locked.pop(data.draw(st.integers(0, len(self.locked) - 1))))

    @rule(pages_needed=st.integers(0, 4), snapshots_needed=st.integers(0, 3))
    def evict(self, pages_needed, snapshots_needed):
        protected = {page for node in self.locked for page in self._path_pages(node)}
        held_slots = {node.snapshot_slot for node in self.locked}
        before = set(self.tree.pages()), set(self.tree.snapshot_slots())
        res = self.tree.evict(pages_needed, snapshots_needed)
        assert not protected & set(res.freed_pages) and not held_slots & set(res.freed_slots)
        assert set(res.freed_pages) <= before[0] and set(res.freed_slots) <= before[1]
        assert len(res.freed_pages) >= pages_needed or self.tree.evictable_pages() == 0
        assert len(res.freed_slots) >= snapshots_needed or self.tree.evictable_snapshots() == 0
        self.returned_pages.update(res.freed_pages)
        self.returned_slots.update(res.freed_slots)
        self.page_at = {k: v for k, v in self.page_at.items() if v not in res.freed_pages}
        self.slot_at = {k: v for k, v in self.slot_at.items() if v not in res.freed_slots}
        tombstone_leaves = [n for n in self._all_nodes()
                            if not n.children and n.snapshot_slot is None and n.full_lock == 0]
        assert not tombstone_leaves, "an unlocked tombstone leaf survived evict()"

    def _path_pages(self, node):
        while node is not None:
            yield from node.page_ids
            node = node.parent

    def _all_nodes(self):
        stack = list(self.tree.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    @invariant()
    def tree_is_intact(self):
        """check_integrity passes after every step."""
        self.tree.check_integrity()

    @invariant()
    def ids_are_conserved(self):
        """Every page / slot handed over is in the tree or was handed back exactly once, never both."""
        tree = self.tree
        for handed, in_tree, returned in ((self.handed_pages, tree.pages(), self.returned_pages),
                                          (self.handed_slots, tree.snapshot_slots(), self.returned_slots)):
            assert all(count == 1 for count in returned.values()), returned
            assert not set(in_tree) & set(returned) and set(in_tree) | set(returned) == handed

    @invariant()
    def model_agrees(self):
        """The tree holds exactly the model's pages and slots, and no locked node was removed."""
        assert set(self.tree.pages()) == set(self.page_at.values())
        assert set(self.tree.snapshot_slots()) == set(self.slot_at.values())
        assert all(node is self.tree.root or node.parent is not None for node in self.locked)


RadixMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestRadixMachine = RadixMachine.TestCase
