"""The radix tree's invariants, checked from scratch by walking the tree (DESIGN.md §3).

Kept beside ``radix.py`` so that the tree's operations and the proof that they kept their promises
can each be read whole. ``check_tree`` reads the tree's private indexes on purpose: it checks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_engine.cache.radix import ChildKey, RadixNode, RadixTree

__all__ = ["TreeIntegrityError", "check_tree", "require"]


class TreeIntegrityError(RuntimeError):
    """The tree broke one of its invariants; the message names the node and the invariant."""


def require(ok: object, message: str) -> None:
    if not ok:
        raise TreeIntegrityError(message)


def check_tree(tree: RadixTree) -> None:
    """Raise TreeIntegrityError naming the first broken invariant. Pure; O(nodes + pages).

    Checks: a bare root; parent/child links; child keys; extra keys; spans non-empty and
    page-aligned with one page id per page; unique node ids, page ids and slots; snapshots at
    aligned depths; lock arithmetic; stamps not ahead of the clock; indices equal to the tree.
    """
    root = tree._root
    require(root.parent is None and not root.tokens and not root.page_ids and root.snapshot_slot is None
             and root.full_lock == root.snapshot_lock == 0, f"root {root!r} must be bare: no parent, "
             "span, pages, snapshot or locks")
    ids, pages, slots, locks = {root.node_id}, {}, {}, 0
    stack = [(root, 0)]
    while stack:
        parent, depth = stack.pop()
        for key, child in parent.children.items():
            require(child.node_id not in ids, f"{child!r}: node id seen twice (reused id or a cycle)")
            ids.add(child.node_id)
            _check_node(tree, child, depth + len(child.tokens))
            _check_link(tree, parent, key, child)
            _claim(pages, child.page_ids, child, "page")
            _claim(slots, () if child.snapshot_slot is None else (child.snapshot_slot,), child, "slot")
            locks += child.snapshot_lock
            stack.append((child, depth + len(child.tokens)))
    for what, walked, index in (("page", pages, tree._page_node), ("slot", slots, tree._slot_node)):
        drift = _drift(walked, index)
        require(not drift, f"{what} index disagrees with the tree on {what}s {drift}")
    require(locks == tree._locks_outstanding, f"snapshot locks in the tree sum to {locks} but "
             f"{tree._locks_outstanding} lock() calls are outstanding (a locked node was lost)")


def _check_link(tree: RadixTree, parent: RadixNode, key: ChildKey, child: RadixNode) -> None:
    require(child.parent is parent, f"{child!r} is a child of {parent!r} but links to {child.parent!r}")
    require(key == tree._key_of(child), f"{child!r} is keyed {key} but its span starts "
             f"{tree._key_of(child)}")
    require(parent is tree._root or child.extra_key == parent.extra_key,
             f"{child!r} has extra_key {child.extra_key!r} under {parent!r}")


def _check_node(tree: RadixTree, node: RadixNode, end: int) -> None:
    size, below = tree.page_size, sum(child.full_lock for child in node.children.values())
    require(node.tokens and len(node.tokens) % size == 0,
             f"{node!r}: span of {len(node.tokens)} tokens is not a non-empty multiple of {size}")
    require(len(node.page_ids) == len(node.tokens) // size,
             f"{node!r}: {len(node.page_ids)} page ids for {len(node.tokens) // size} pages")
    require(node.snapshot_slot is None or end % tree.snapshot_align == 0,
             f"{node!r}: snapshot at depth {end}, not a multiple of {tree.snapshot_align}")
    require(0 <= node.snapshot_lock <= node.full_lock, f"{node!r}: not 0 <= snapshot_lock <= full_lock")
    require(node.full_lock == node.snapshot_lock + below, f"{node!r}: full_lock must equal its "
             f"snapshot_lock plus its children's full locks ({node.snapshot_lock} + {below})")
    require(0 < node.node_id < tree._next_id, f"{node!r}: node id was never issued")
    require(max(node.full_stamp, node.snapshot_stamp) <= tree._clock,
             f"{node!r}: LRU stamp ahead of the clock {tree._clock}")


def _claim(owned: dict[int, RadixNode], ids: Sequence[int], node: RadixNode, what: str) -> None:
    for ident in ids:
        require(ident not in owned, f"{what} {ident} is owned twice: by {owned.get(ident)!r} and {node!r}")
        owned[ident] = node


def _drift(walked: dict[int, RadixNode], index: dict[int, RadixNode]) -> list[int]:
    return sorted(key for key in walked.keys() | index.keys() if walked.get(key) is not index.get(key))
