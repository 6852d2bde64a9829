"""Slot and page pools: lowest-first ids, exclusive / ref-counted ownership, integrity that can fail."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mini_engine.cache.pools import IntegrityError, Owner, OwnershipError, PagePool, PoolExhausted, SlotPool

A_LIVE = Owner("request", "a", "live")
A_PING = Owner("request", "a", "pingpong")
B_LIVE = Owner("request", "b", "live")
NODE7 = Owner("tree", 7, "snapshot")
A_KV = Owner("request", "a", "kv")
B_KV = Owner("request", "b", "kv")
NODE_KV = Owner("tree", 3, "kv")
FAST = settings(max_examples=40, stateful_step_count=25, deadline=None, database=None)


# --- Owner -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, words", [
    (("node", "a", "live"), ["Owner.kind='node'", "'request', 'tree'"]),
    (("request", 3, "live"), ["Owner.ident=3", "non-empty str"]),
    (("request", "", "live"), ["Owner.ident=''", "non-empty str"]),
    (("tree", "7", "snapshot"), ["Owner.ident='7'", "non-negative int"]),
    (("tree", True, "snapshot"), ["Owner.ident=True", "non-negative int"]),
    (("tree", -1, "snapshot"), ["Owner.ident=-1", "non-negative int"]),
    (("request", "a", "owner"), ["Owner.role='owner'", "'live', 'pingpong', 'snapshot', 'kv'"]),
])
def test_owner_rejects_bad_fields(fields, words):
    """A bad Owner field is refused with its name and the allowed values."""
    with pytest.raises(ValueError) as err:
        Owner(*fields)
    assert all(word in str(err.value) for word in words)


def test_owner_is_frozen_and_readable():
    """Owners are immutable values with a readable str."""
    assert Owner("request", "a", "live") == A_LIVE and hash(A_LIVE) == hash(Owner("request", "a", "live"))
    with pytest.raises(AttributeError):
        A_LIVE.role = "snapshot"
    assert (str(A_LIVE), str(NODE7)) == ("request 'a' (live)", "tree node 7 (snapshot)")


# --- SlotPool ----------------------------------------------------------------------------------

@pytest.mark.parametrize("capacity", [0, -1, 2.0])
def test_slot_pool_validates_capacity(capacity):
    """A slot pool needs an int capacity of at least 1 and says so."""
    with pytest.raises(ValueError, match=r"SlotPool capacity=.* must be an int >= 1"):
        SlotPool(capacity)


def test_slots_are_handed_out_lowest_first_never_zero():
    """Allocation is deterministic: lowest free id first, slot 0 never."""
    pool = SlotPool(4)
    assert [pool.alloc(A_LIVE), pool.alloc(A_PING), pool.alloc(NODE7)] == [1, 2, 3]
    pool.free(2, A_PING)
    assert pool.alloc_many([B_LIVE, A_PING]) == (2, 4)
    assert (pool.capacity, pool.free_count, pool.used_count) == (4, 0, 4)
    assert pool.owner_of(0) is None


def test_slot_alloc_many_is_all_or_nothing():
    """An alloc_many that does not fit allocates nothing and reports capacity and usage by role."""
    pool = SlotPool(3)
    pool.alloc_many([A_LIVE, NODE7])
    with pytest.raises(PoolExhausted) as err:
        pool.alloc_many([B_LIVE, B_LIVE])
    message = str(err.value)
    assert "SlotPool exhausted: 2 slot(s) requested, 1 free of capacity 3" in message
    assert "live=1, pingpong=0, snapshot=1" in message and "Evict tree snapshots" in message
    assert (err.value.requested, err.value.free) == (2, 1)
    assert pool.free_count == 1 and pool.slots_of("request", "b") == ()
    pool.check_integrity()


def test_slot_pool_refuses_page_roles_and_non_owners():
    """Slots hold only slot roles; a kv owner or a bare string is refused by name."""
    pool = SlotPool(2)
    with pytest.raises(ValueError, match=r"SlotPool cannot hold role 'kv'.*allowed roles"):
        pool.alloc(A_KV)
    with pytest.raises(TypeError, match="SlotPool owners must be Owner instances, got 'a'"):
        pool.alloc_many(["a"])
    with pytest.raises(ValueError, match="SlotPool cannot hold role 'kv'"):
        pool.transfer(pool.alloc(A_LIVE), A_LIVE, A_KV)
    assert pool.free_count == 1


@pytest.mark.parametrize("slot, claimed, words", [
    (3, A_LIVE, ["slot 3 is free, owned by nobody", "request 'a' (live) claimed it"]),
    (2, B_LIVE, ["slot 2 is owned by tree node 7 (snapshot)", "request 'b' (live) claimed it"]),
    (0, A_LIVE, ["slot 0 is the padding sink", "request 'a' (live) claimed it"]),
    (9, A_LIVE, ["slot 9 is outside 1..3", "request 'a' (live) claimed it"]),
])
def test_slot_free_names_slot_claimant_and_owner(slot, claimed, words):
    """A refused free names the slot, the claimed owner and the actual owner, and changes nothing."""
    pool = SlotPool(3)
    pool.alloc_many([B_LIVE, NODE7])
    with pytest.raises(OwnershipError) as err:
        pool.free(slot, claimed)
    assert all(word in str(err.value) for word in words)
    pool.check_integrity(expected={1: B_LIVE, 2: NODE7})


def test_slot_transfer_moves_ownership_between_indexes():
    """transfer hands a slot to the tree: owner map and per-owner index both follow."""
    pool = SlotPool(3)
    slot = pool.alloc_many([A_LIVE, A_PING])[1]
    pool.transfer(slot, A_PING, NODE7)
    assert pool.owner_of(slot) == NODE7
    assert (pool.slots_of("request", "a"), pool.slots_of("tree", 7)) == ((1,), (2,))
    assert pool.usage_by_role() == {"live": 1, "pingpong": 0, "snapshot": 1}
    with pytest.raises(OwnershipError, match=r"slot 2 is owned by tree node 7 \(snapshot\); request 'a'"):
        pool.transfer(slot, A_PING, B_LIVE)
    pool.check_integrity(expected={1: A_LIVE, 2: NODE7})


def test_slot_owner_of_rejects_out_of_range():
    """owner_of names the valid range when asked about a slot that does not exist."""
    with pytest.raises(ValueError, match=r"slot=4 is outside 0\.\.3"):
        SlotPool(3).owner_of(4)


def test_slot_integrity_cross_check_names_each_disagreeing_slot():
    """check_integrity(expected=...) names every slot where the pool and the caller disagree."""
    pool = SlotPool(4)
    pool.alloc_many([A_LIVE, NODE7])
    pool.check_integrity(expected={1: A_LIVE, 2: NODE7})
    with pytest.raises(IntegrityError) as err:
        pool.check_integrity(expected={1: B_LIVE, 3: NODE7})
    message = str(err.value)
    assert "3 problem(s)" in message
    assert "slot 1: pool says request 'a' (live), expected request 'b' (live)" in message
    assert "slot 2: pool says tree node 7 (snapshot), expected free" in message
    assert "slot 3: pool says free, expected tree node 7 (snapshot)" in message


@pytest.mark.parametrize("corrupt, words", [
    (lambda p: p._free.append(3), "slot 3 is 2 times in the free list"),
    (lambda p: p._free.append(1), "slot 1 is both free and in use"),
    (lambda p: p._free.append(0), "slot 0 (the padding sink) is in the free list but outside the pool's ids 1..4"),
    (lambda p: p._used.__setitem__(0, A_LIVE), "slot 0 (the padding sink) is in use but outside"),
    (lambda p: p._free.remove(4), "slot 4 is neither free nor in use (leaked)"),
    (lambda p: p._by_ident[("request", "a")].add(3), "per-owner index for ('request', 'a') lists [1, 3]"),
    (lambda p: p._used.__setitem__(1, B_LIVE), "index for ('request', 'b') lists [], the primary map gives [1]"),
    (lambda p: p._by_ident.__setitem__(("request", "z"), set()), "per-owner index for ('request', 'z') lists []"),
])
def test_slot_integrity_catches_corruption(corrupt, words):
    """Each kind of corrupted slot bookkeeping makes check_integrity raise, naming the problem."""
    pool = SlotPool(4)
    pool.alloc_many([A_LIVE, NODE7])
    pool.check_integrity()
    corrupt(pool)
    with pytest.raises(IntegrityError, match="SlotPool.*integrity check failed") as err:
        pool.check_integrity()
    assert words in str(err.value)


# --- PagePool ----------------------------------------------------------------------------------

@pytest.mark.parametrize("capacity, page_size, words", [
    (0, 16, "PagePool capacity=0 must be an int >= 1"),
    (8, 3, "PagePool page_size=3 must divide 64 (allowed: 1, 2, 4, 8, 16, 32, 64)"),
    (8, 128, "PagePool page_size=128 must divide 64"),
    (8, 0, "PagePool page_size=0 must divide 64"),
])
def test_page_pool_validates_fields(capacity, page_size, words):
    """A page pool refuses a bad capacity or a page size that does not divide 64, naming the field."""
    with pytest.raises(ValueError) as err:
        PagePool(capacity, page_size)
    assert words in str(err.value)


def test_pages_for_tokens_is_ceil_division():
    """pages_for_tokens rounds up to whole pages and refuses negative counts."""
    pool = PagePool(4, 16)
    assert [pool.pages_for_tokens(n) for n in (0, 1, 16, 17, 64)] == [0, 1, 1, 2, 4]
    with pytest.raises(ValueError, match="n_tokens=-1 must be a non-negative int"):
        pool.pages_for_tokens(-1)


def test_page_alloc_lowest_first_all_or_nothing():
    """Pages come lowest first; a request that does not fit allocates nothing and says why."""
    pool = PagePool(4, 16)
    assert (pool.alloc(NODE_KV, 2), pool.alloc(A_KV, 0), pool.page_size) == ((0, 1), (), 16)
    with pytest.raises(PoolExhausted) as err:
        pool.alloc(A_KV, 3)
    message = str(err.value)
    assert "PagePool exhausted: 3 page(s) requested, 2 free of capacity 4" in message
    assert "holds by kind: request=0, tree=2" in message and "Evict tree nodes" in message
    assert (pool.free_count, pool.used_count, pool.pages_of("request", "a")) == (2, 2, ())
    with pytest.raises(ValueError, match="n=-1 must be a non-negative int"):
        pool.alloc(A_KV, -1)
    with pytest.raises(ValueError, match=r"PagePool cannot hold role 'live'.*allowed roles: \('kv',\)"):
        pool.alloc(A_LIVE, 1)


def test_page_sharing_counts_references():
    """retain shares a page, release frees it only when the last holder lets go."""
    pool = PagePool(4, 16)
    page, other = pool.alloc(NODE_KV, 2)
    pool.retain(page, A_KV)
    assert (pool.refcount(page), pool.is_shared(page), pool.is_shared(other)) == (2, True, False)
    assert pool.holders(page) == frozenset({NODE_KV, A_KV}) and pool.pages_of("tree", 3) == (0, 1)
    assert pool.release(page, NODE_KV) is False and pool.holders(page) == frozenset({A_KV})
    assert pool.release(page, A_KV) is True
    assert (pool.refcount(page), pool.free_count, pool.alloc(B_KV, 1)) == (0, 3, (0,))
    pool.check_integrity(expected_holders={0: frozenset({B_KV}), 1: frozenset({NODE_KV}), 2: frozenset()})


@pytest.mark.parametrize("action, words", [
    (lambda p: p.retain(2, A_KV), "page 2 is free, held by nobody; request 'a' (kv) cannot retain"),
    (lambda p: p.release(2, A_KV), "page 2 is free, held by nobody; request 'a' (kv) cannot retain or release"),
    (lambda p: p.retain(0, NODE_KV), "page 0 is already held by tree node 3 (kv)"),
    (lambda p: p.release(0, B_KV), "page 0 is not held by request 'b' (kv); its holders are [tree node 3 (kv)]"),
])
def test_page_ownership_errors_name_page_and_holders(action, words):
    """Retaining a free page, retaining twice or releasing as a non-holder is refused by name."""
    pool = PagePool(4, 16)
    pool.alloc(NODE_KV, 2)
    with pytest.raises(OwnershipError) as err:
        action(pool)
    assert words in str(err.value)
    pool.check_integrity(expected_holders={0: frozenset({NODE_KV}), 1: frozenset({NODE_KV})})


def test_page_ids_out_of_range_are_refused():
    """Every page query refuses an id outside 0..capacity-1 with the range in the message."""
    pool = PagePool(2, 8)
    for call in (pool.holders, pool.refcount, pool.is_shared, lambda page: pool.retain(page, A_KV)):
        with pytest.raises(ValueError, match=r"page=2 is outside 0\.\.1"):
            call(2)


def test_page_integrity_cross_check_names_each_disagreeing_page():
    """check_integrity(expected_holders=...) names every page whose holders disagree."""
    pool = PagePool(4, 16)
    pool.alloc(NODE_KV, 2)
    with pytest.raises(IntegrityError) as err:
        pool.check_integrity(expected_holders={0: frozenset({NODE_KV, A_KV}), 2: frozenset({A_KV})})
    message = str(err.value)
    assert "page 0: pool says held by [tree node 3 (kv)], expected [request 'a' (kv), tree node 3 (kv)]" in message
    assert "page 1: pool says held by [tree node 3 (kv)], expected nobody (free)" in message
    assert "page 2: pool says held by nobody (free), expected [request 'a' (kv)]" in message


@pytest.mark.parametrize("corrupt, words", [
    (lambda p: p._free.append(3), "page 3 is 2 times in the free list"),
    (lambda p: p._free.append(0), "page 0 is both free and in use"),
    (lambda p: p._free.append(9), "page 9 is in the free list but outside the pool's ids 0..3"),
    (lambda p: p._free.remove(2), "page 2 is neither free nor in use (leaked)"),
    (lambda p: p._used[1].clear(), "page 1 is in use with no holder"),
    (lambda p: p._used[0].add(B_KV), "per-holder index for request 'b' (kv) lists [], the primary map gives [0]"),
    (lambda p: p._by_holder[NODE_KV].add(3), "per-holder index for tree node 3 (kv) lists [0, 1, 3]"),
])
def test_page_integrity_catches_corruption(corrupt, words):
    """Each kind of corrupted page bookkeeping makes check_integrity raise, naming the problem."""
    pool = PagePool(4, 16)
    pool.alloc(NODE_KV, 2)
    pool.check_integrity()
    corrupt(pool)
    with pytest.raises(IntegrityError, match="PagePool.*integrity check failed") as err:
        pool.check_integrity()
    assert words in str(err.value)


# --- Stateful: the pools against a dict model ----------------------------------------------------

def owners(request_roles, tree_role):
    """Owners drawn from three requests and four tree nodes, so that collisions are frequent."""
    return (st.builds(Owner, st.just("request"), st.sampled_from("abc"), st.sampled_from(request_roles))
            | st.builds(Owner, st.just("tree"), st.integers(0, 3), st.just(tree_role)))


SLOT_OWNERS, PAGE_OWNERS = owners(["live", "pingpong"], "snapshot"), owners(["kv"], "kv")


class SlotPoolMachine(RuleBasedStateMachine):
    """The model: slot -> owner; free slots are the rest of 1..6, handed out lowest first."""

    def __init__(self):
        super().__init__()
        self.pool, self.model = SlotPool(6), {}

    @rule(owners=st.lists(SLOT_OWNERS, max_size=4))
    def alloc_many(self, owners):
        free = sorted(set(range(1, 7)) - set(self.model))
        if len(owners) > len(free):
            with pytest.raises(PoolExhausted):
                self.pool.alloc_many(owners)
            return
        slots = self.pool.alloc_many(owners)
        assert slots == tuple(free[:len(owners)])
        self.model.update(zip(slots, owners))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data):
        slot = data.draw(st.sampled_from(sorted(self.model)))
        self.pool.free(slot, self.model.pop(slot))

    @rule(slot=st.integers(0, 7), claimed=SLOT_OWNERS)
    def free_by_non_owner_is_refused(self, slot, claimed):
        if self.model.get(slot) != claimed:
            with pytest.raises(OwnershipError):
                self.pool.free(slot, claimed)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), to_owner=SLOT_OWNERS)
    def transfer(self, data, to_owner):
        slot = data.draw(st.sampled_from(sorted(self.model)))
        self.pool.transfer(slot, self.model[slot], to_owner)
        self.model[slot] = to_owner

    @invariant()
    def matches_model(self):
        self.pool.check_integrity(expected=self.model)
        assert self.pool.free_count == 6 - len(self.model)
        for owner in set(self.model.values()):
            key = (owner.kind, owner.ident)
            mine = tuple(slot for slot, o in sorted(self.model.items()) if (o.kind, o.ident) == key)
            assert self.pool.slots_of(*key) == mine


class PagePoolMachine(RuleBasedStateMachine):
    """The model: page -> set of holders; a page is free when absent."""

    def __init__(self):
        super().__init__()
        self.pool, self.model = PagePool(8, 16), {}

    @rule(owner=PAGE_OWNERS, n=st.integers(0, 4))
    def alloc(self, owner, n):
        free = sorted(set(range(8)) - set(self.model))
        if n > len(free):
            with pytest.raises(PoolExhausted):
                self.pool.alloc(owner, n)
            return
        assert self.pool.alloc(owner, n) == tuple(free[:n])
        self.model.update({page: {owner} for page in free[:n]})

    @precondition(lambda self: self.model)
    @rule(data=st.data(), owner=PAGE_OWNERS)
    def retain(self, data, owner):
        page = data.draw(st.sampled_from(sorted(self.model)))
        if owner in self.model[page]:
            with pytest.raises(OwnershipError):
                self.pool.retain(page, owner)
            return
        self.pool.retain(page, owner)
        self.model[page].add(owner)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def release(self, data):
        page = data.draw(st.sampled_from(sorted(self.model)))
        owner = data.draw(st.sampled_from(sorted(self.model[page], key=str)))
        self.model[page].discard(owner)
        assert self.pool.release(page, owner) is (not self.model[page])
        if not self.model[page]:
            del self.model[page]

    @rule(page=st.integers(0, 7), owner=PAGE_OWNERS)
    def release_by_non_holder_is_refused(self, page, owner):
        if owner not in self.model.get(page, ()):
            with pytest.raises(OwnershipError):
                self.pool.release(page, owner)

    @invariant()
    def matches_model(self):
        self.pool.check_integrity(expected_holders={page: frozenset(h) for page, h in self.model.items()})
        assert self.pool.used_count == len(self.model)
        assert all(self.pool.refcount(page) == len(h) for page, h in self.model.items())


class TestSlotPoolAgainstModel(SlotPoolMachine.TestCase):
    """Random alloc/free/transfer runs keep the slot pool equal to a dict model and integrity-clean."""

    settings = FAST


class TestPagePoolAgainstModel(PagePoolMachine.TestCase):
    """Random alloc/retain/release runs keep the page pool equal to a ref-count model and integrity-clean."""

    settings = FAST
