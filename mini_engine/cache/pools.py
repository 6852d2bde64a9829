"""Slot and page allocators: integer ids and who owns them (the tensors live in the model runner).

Two pools, two ownership rules:

- ``SlotPool``: linear-state slots ``1..capacity``; slot 0 is the padding sink and belongs to no
  one. One owner per slot (a request's live / ping-pong slot, or a tree node's snapshot).
- ``PagePool``: KV pages ``0..capacity-1``, shared by reference counting between tree nodes and
  requests. A shared page must be copied before a write (page copy-on-write).

Both hand out the lowest free id first, so a seeded run allocates the same ids every time.
Neither is thread-safe: the scheduler thread owns them. ``check_integrity()`` checks the
conservation law (free + owned = total, one owner per slot) and can cross-check an external view.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mini_engine.constants import SNAPSHOT_ALIGN

__all__ = ["Owner", "SlotPool", "PagePool", "PoolExhausted", "OwnershipError", "IntegrityError"]

KINDS = ("request", "tree")
SLOT_ROLES = ("live", "pingpong", "snapshot")
PAGE_ROLE = "kv"


class PoolExhausted(RuntimeError):
    """Not enough free ids; nothing was allocated. ``requested``/``free`` say by how much."""

    def __init__(self, message: str, *, requested: int, free: int):
        super().__init__(message)
        self.requested = requested
        self.free = free


class OwnershipError(RuntimeError):
    """A caller named an owner that does not hold the id (double free, wrong owner, free id)."""


class IntegrityError(RuntimeError):
    """The pool's bookkeeping broke its conservation law; the message lists every problem."""


@dataclass(frozen=True)
class Owner:
    """Who holds an id: ``kind`` "request" (ident: request id) or "tree" (ident: node id)."""

    kind: str
    ident: str | int
    role: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Owner.kind={self.kind!r} is not one of {KINDS}")
        if self.kind == "request" and not (isinstance(self.ident, str) and self.ident):
            raise ValueError(f"Owner.ident={self.ident!r}: a request owner needs a non-empty str request id")
        if self.kind == "tree" and (type(self.ident) is not int or self.ident < 0):
            raise ValueError(f"Owner.ident={self.ident!r}: a tree owner needs a non-negative int node id")
        if self.role not in SLOT_ROLES + (PAGE_ROLE,):
            raise ValueError(f"Owner.role={self.role!r} is not one of {SLOT_ROLES + (PAGE_ROLE,)}")

    def __str__(self) -> str:
        who = f"request {self.ident!r}" if self.kind == "request" else f"tree node {self.ident}"
        return f"{who} ({self.role})"


def _require_role(owner: Owner, allowed: tuple[str, ...], pool: str) -> None:
    if not isinstance(owner, Owner):
        raise TypeError(f"{pool} owners must be Owner instances, got {owner!r}")
    if owner.role not in allowed:
        raise ValueError(f"{pool} cannot hold role {owner.role!r} ({owner}); allowed roles: {allowed}")


def _require_count(n: int, field: str) -> None:
    if type(n) is not int or n < 0:
        raise ValueError(f"{field}={n!r} must be a non-negative int")


def _index_problems(index: Mapping, rebuilt: Mapping, what: str) -> list[str]:
    """The per-holder index must agree exactly with the index rebuilt from the primary map."""
    return [f"{what} index for {key} lists {sorted(index.get(key, ()))}, the primary map gives "
            f"{sorted(rebuilt.get(key, ()))}"
            for key in sorted(set(index) | set(rebuilt), key=str) if index.get(key) != rebuilt.get(key)]


class _IdPool:
    """What both pools share: a lowest-first free list, ``_used`` (id -> owner info), the conservation law."""

    _unit = "id"

    def __init__(self, capacity: int, ids: range):
        self._capacity = capacity
        self._ids = ids
        self._free = list(ids)  # a min-heap (a sorted list is one): lowest free id first, reproducibly
        self._used: dict = {}

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used_count(self) -> int:
        return len(self._used)

    def _take(self, n: int) -> tuple[int, ...]:
        return tuple(heapq.heappop(self._free) for _ in range(n))

    def _label(self, ident: int) -> str:
        return f"{self._unit} {ident}"

    def _partition_problems(self) -> list[str]:
        """Free and used ids must split the pool's ids exactly: no duplicates, overlap, strays or gaps."""
        free, used, ids = self._free, set(self._used), set(self._ids)
        counts, span, label = Counter(free), f"{self._ids.start}..{self._ids.stop - 1}", self._label
        return ([f"{label(i)} is {counts[i]} times in the free list" for i in sorted(counts) if counts[i] > 1]
                + [f"{label(i)} is both free and in use" for i in sorted(used & set(free))]
                + [f"{label(i)} is in the free list but outside the pool's ids {span}" for i in sorted(set(free) - ids)]
                + [f"{label(i)} is in use but outside the pool's ids {span}" for i in sorted(used - ids)]
                + [f"{label(i)} is neither free nor in use (leaked)" for i in sorted(ids - used - set(free))])

    def _raise_if(self, problems: list[str]) -> None:
        if problems:
            raise IntegrityError(f"{self!r} integrity check failed ({len(problems)} problem(s)):\n  "
                                 + "\n  ".join(problems))

    def _exhausted(self, requested: int, usage: str, advice: str) -> PoolExhausted:
        return PoolExhausted(f"{type(self).__name__} exhausted: {requested} {self._unit}(s) requested, "
                             f"{self.free_count} free of capacity {self._capacity} ({usage}). {advice}",
                             requested=requested, free=self.free_count)


class SlotPool(_IdPool):
    """Linear-state slot ids ``1..capacity``, each with exactly one owner while in use."""

    _unit = "slot"
    _used: dict[int, Owner]  # slot -> its one owner

    def __init__(self, capacity: int):
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"SlotPool capacity={capacity!r} must be an int >= 1 (the padding slot 0 is extra)")
        super().__init__(capacity, range(1, capacity + 1))
        self._by_ident: dict[tuple[str, str | int], set[int]] = {}

    def __repr__(self) -> str:
        return f"SlotPool(capacity={self._capacity}, free={self.free_count})"

    def usage_by_role(self) -> dict[str, int]:
        """Slots in use per role (every role present, zeros included). Pure."""
        counts = Counter(owner.role for owner in self._used.values())
        return {role: counts[role] for role in SLOT_ROLES}

    def alloc(self, owner: Owner) -> int:
        """Give the lowest free slot to ``owner``. Mutates. Raises PoolExhausted, ValueError (role)."""
        return self.alloc_many([owner])[0]

    def alloc_many(self, owners: Iterable[Owner]) -> tuple[int, ...]:
        """One slot per owner, lowest ids first, all or nothing. Mutates only on success.

        Raises PoolExhausted (nothing allocated) or ValueError (an owner has the page role)."""
        owners = list(owners)
        for owner in owners:
            _require_role(owner, SLOT_ROLES, "SlotPool")
        if len(owners) > self.free_count:
            usage = ", ".join(f"{role}={n}" for role, n in self.usage_by_role().items())
            raise self._exhausted(len(owners), f"owned by role: {usage}", "Evict tree snapshots, wait for "
                                  "requests to finish, or raise the slot capacity.")
        slots = self._take(len(owners))
        for slot, owner in zip(slots, owners):
            self._set_owner(slot, owner)
        return slots

    def free(self, slot: int, owner: Owner) -> None:
        """Return ``slot`` to the free list. Mutates. Raises OwnershipError unless ``owner`` holds it."""
        self._require_owner(slot, owner)
        self._drop_owner(slot, owner)
        heapq.heappush(self._free, slot)

    def transfer(self, slot: int, from_owner: Owner, to_owner: Owner) -> None:
        """Hand ``slot`` from one owner to another (``donate=transfer``). Mutates.

        Raises OwnershipError unless ``from_owner`` holds it; ValueError if ``to_owner`` has the page role."""
        _require_role(to_owner, SLOT_ROLES, "SlotPool")
        self._require_owner(slot, from_owner)
        self._drop_owner(slot, from_owner)
        self._set_owner(slot, to_owner)

    def owner_of(self, slot: int) -> Owner | None:
        """The slot's owner; None when it is free or is the sink. Pure. Raises ValueError (range)."""
        if type(slot) is not int or not 0 <= slot <= self._capacity:
            raise ValueError(f"slot={slot!r} is outside 0..{self._capacity} of {self!r}")
        return self._used.get(slot)

    def slots_of(self, kind: str, ident: str | int) -> tuple[int, ...]:
        """Every slot held by ``(kind, ident)`` in any role, ascending. Pure."""
        return tuple(sorted(self._by_ident.get((kind, ident), ())))

    def check_integrity(self, expected: Mapping[int, Owner] | None = None) -> None:
        """Raise IntegrityError listing every broken invariant. Pure.

        With ``expected`` (slot -> owner, as the tree and requests see it) the owner map must equal it
        exactly; every disagreeing slot is named."""
        rebuilt: dict[tuple, set[int]] = {}
        for slot, owner in self._used.items():
            rebuilt.setdefault((owner.kind, owner.ident), set()).add(slot)
        problems = self._partition_problems() + _index_problems(self._by_ident, rebuilt, "per-owner")
        if expected is not None:
            problems += [f"{self._label(slot)}: pool says {self._used.get(slot) or 'free'}, "
                         f"expected {expected.get(slot) or 'free'}"
                         for slot in sorted(set(self._used) | set(expected))
                         if self._used.get(slot) != expected.get(slot)]
        self._raise_if(problems)

    def _label(self, slot: int) -> str:
        return "slot 0 (the padding sink)" if slot == 0 else f"slot {slot}"

    def _require_owner(self, slot: int, claimed: Owner) -> None:
        if slot == 0:
            raise OwnershipError(f"slot 0 is the padding sink, owned by nobody; {claimed} claimed it. "
                                 "The sink is never allocated or freed.")
        if type(slot) is not int or not 1 <= slot <= self._capacity:
            raise OwnershipError(f"slot {slot!r} is outside 1..{self._capacity}, owned by nobody; "
                                 f"{claimed} claimed it")
        actual = self._used.get(slot)
        if actual != claimed:
            state = f"is owned by {actual}" if actual else "is free, owned by nobody (double free?)"
            raise OwnershipError(f"slot {slot} {state}; {claimed} claimed it. Release it through its actual owner.")

    def _set_owner(self, slot: int, owner: Owner) -> None:
        self._used[slot] = owner
        self._by_ident.setdefault((owner.kind, owner.ident), set()).add(slot)

    def _drop_owner(self, slot: int, owner: Owner) -> None:
        del self._used[slot]
        held = self._by_ident[(owner.kind, owner.ident)]
        held.discard(slot)
        if not held:
            del self._by_ident[(owner.kind, owner.ident)]


class PagePool(_IdPool):
    """KV page ids ``0..capacity-1``, reference-counted: a page is free when its last holder lets go."""

    _unit = "page"
    _used: dict[int, set[Owner]]  # page -> its holders (never empty)

    def __init__(self, capacity: int, page_size: int):
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"PagePool capacity={capacity!r} must be an int >= 1")
        if type(page_size) is not int or page_size < 1 or SNAPSHOT_ALIGN % page_size:
            raise ValueError(f"PagePool page_size={page_size!r} must divide {SNAPSHOT_ALIGN} "
                             "(allowed: 1, 2, 4, 8, 16, 32, 64)")
        super().__init__(capacity, range(capacity))
        self._page_size = page_size
        self._by_holder: dict[Owner, set[int]] = {}

    def __repr__(self) -> str:
        return f"PagePool(capacity={self._capacity}, page_size={self._page_size}, free={self.free_count})"

    @property
    def page_size(self) -> int:
        return self._page_size

    def pages_for_tokens(self, n_tokens: int) -> int:
        """Pages needed to hold ``n_tokens`` tokens (ceil division). Pure. Raises ValueError (< 0)."""
        _require_count(n_tokens, "n_tokens")
        return -(-n_tokens // self._page_size)

    def alloc(self, owner: Owner, n: int) -> tuple[int, ...]:
        """``n`` fresh pages held only by ``owner``, lowest ids first, all or nothing. Mutates on success.

        Raises PoolExhausted (nothing allocated), ValueError (role not "kv", n < 0)."""
        _require_role(owner, (PAGE_ROLE,), "PagePool")
        _require_count(n, "n")
        if n > self.free_count:
            by_kind = Counter(holder.kind for holders in self._used.values() for holder in holders)
            held = ", ".join(f"{kind}={by_kind[kind]}" for kind in KINDS)
            raise self._exhausted(n, f"holds by kind: {held}", "Evict tree nodes, wait for requests "
                                  "to finish, or raise the page capacity.")
        pages = self._take(n)
        for page in pages:
            self._used[page] = set()
            self._add_holder(page, owner)
        return pages

    def retain(self, page: int, owner: Owner) -> None:
        """Add ``owner`` as a holder of a page in use (a hit shares it). Mutates.

        Raises OwnershipError if the page is free or ``owner`` already holds it; ValueError (role, range)."""
        _require_role(owner, (PAGE_ROLE,), "PagePool")
        holders = self._holders_or_raise(page, owner)
        if owner in holders:
            raise OwnershipError(f"page {page} is already held by {owner}; a holder retains a page once. "
                                 "Release before retaining again.")
        self._add_holder(page, owner)

    def release(self, page: int, owner: Owner) -> bool:
        """Drop ``owner``'s hold; True when that was the last holder and the page is free again. Mutates.

        Raises OwnershipError if ``owner`` does not hold the page; ValueError (range)."""
        holders = self._holders_or_raise(page, owner)
        if owner not in holders:
            raise OwnershipError(f"page {page} is not held by {owner}; its holders are "
                                 f"{self._names(holders)}. Release it through one of its holders.")
        holders.discard(owner)
        self._by_holder[owner].discard(page)
        if not self._by_holder[owner]:
            del self._by_holder[owner]
        if holders:
            return False
        del self._used[page]
        heapq.heappush(self._free, page)
        return True

    def holders(self, page: int) -> frozenset[Owner]:
        """The page's holders (empty when free). Pure. Raises ValueError (range)."""
        if type(page) is not int or not 0 <= page < self._capacity:
            raise ValueError(f"page={page!r} is outside 0..{self._capacity - 1} of {self!r}")
        return frozenset(self._used.get(page, ()))

    def refcount(self, page: int) -> int:
        """Number of holders (0 when free). Pure. Raises ValueError (range)."""
        return len(self.holders(page))

    def is_shared(self, page: int) -> bool:
        """More than one holder: copy the page before writing into it (copy-on-write). Pure."""
        return self.refcount(page) > 1

    def pages_of(self, kind: str, ident: str | int) -> tuple[int, ...]:
        """Every page held by ``(kind, ident)``, ascending. Pure. Raises ValueError (bad owner fields)."""
        return tuple(sorted(self._by_holder.get(Owner(kind, ident, PAGE_ROLE), ())))

    def check_integrity(self, expected_holders: Mapping[int, frozenset[Owner]] | None = None) -> None:
        """Raise IntegrityError listing every broken invariant. Pure.

        With ``expected_holders`` (page -> holders, as the tree and requests see it; a page absent or
        mapped to no holders is expected free) the holder map must match exactly, page by page."""
        rebuilt: dict[Owner, set[int]] = {}
        for page, holders in self._used.items():
            for owner in holders:
                rebuilt.setdefault(owner, set()).add(page)
        problems = self._partition_problems() + _index_problems(self._by_holder, rebuilt, "per-holder")
        problems += [f"page {page} is in use with no holder (should have been freed)"
                     for page, holders in sorted(self._used.items()) if not holders]
        if expected_holders is not None:
            wanted = {page: set(holders) for page, holders in expected_holders.items() if holders}
            problems += [f"page {page}: pool says held by {self._names(self._used.get(page, ()))}, "
                         f"expected {self._names(wanted.get(page, ()))}"
                         for page in sorted(set(self._used) | set(wanted))
                         if self._used.get(page) != wanted.get(page)]
        self._raise_if(problems)

    @staticmethod
    def _names(holders: Iterable[Owner]) -> str:
        return "[" + ", ".join(sorted(map(str, holders))) + "]" if holders else "nobody (free)"

    def _holders_or_raise(self, page: int, claimed: Owner) -> set[Owner]:
        self.holders(page)  # range check
        if page not in self._used:
            raise OwnershipError(f"page {page} is free, held by nobody; {claimed} cannot retain or release "
                                 "it. Allocate pages with alloc() first.")
        return self._used[page]

    def _add_holder(self, page: int, owner: Owner) -> None:
        self._used[page].add(owner)
        self._by_holder.setdefault(owner, set()).add(page)
