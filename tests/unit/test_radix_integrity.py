"""check_integrity is proven able to fail: every corrupted invariant of the radix tree is named."""

import pytest

from mini_engine.cache.radix import RadixTree, TreeIntegrityError
from tests.unit.radix_support import put, toks


def sample_tree():
    tree = RadixTree(16)
    nodes = {"a": put(tree, toks(64), slot=1).node, "b": put(tree, toks(128), slot=2).node,
             "c": put(tree, toks(64, 500), "x", slot=3).node, "d": put(tree, toks(80)).node}
    tree.lock(nodes["b"])
    tree.check_integrity()
    return tree, nodes


def rekey(node, extra_key=None, key=None):
    parent = node.parent
    old = next(k for k, child in parent.children.items() if child is node)
    del parent.children[old]
    node.extra_key = extra_key or node.extra_key
    parent.children[key or (node.extra_key, old[1])] = node


CORRUPTIONS = {
    "parent link": (lambda t, n: setattr(n["b"], "parent", t.root), "links to"),
    "child key": (lambda t, n: rekey(n["c"], key=("x", (9,))), "is keyed"),
    "extra key": (lambda t, n: rekey(n["b"], extra_key="other"), "has extra_key"),
    "empty span": (lambda t, n: [setattr(n["b"], field, ()) for field in ("tokens", "page_ids")], "non-empty"),
    "ragged span": (lambda t, n: setattr(n["b"], "tokens", n["b"].tokens[:-1]), "non-empty multiple"),
    "page count": (lambda t, n: setattr(n["b"], "page_ids", n["b"].page_ids[:-1]), "page ids for"),
    "page twice": (lambda t, n: setattr(n["c"], "page_ids", n["a"].page_ids[:1] + n["c"].page_ids[1:]),
                   "owned twice"),
    "slot twice": (lambda t, n: setattr(n["c"], "snapshot_slot", 1), "owned twice"),
    "unaligned snapshot": (lambda t, n: setattr(n["d"], "snapshot_slot", 99), "depth 80"),
    "snapshot above full": (lambda t, n: setattr(n["b"], "snapshot_lock", 5), "snapshot_lock <= full_lock"),
    "negative lock": (lambda t, n: setattr(n["c"], "snapshot_lock", -1), "snapshot_lock <= full_lock"),
    "parent under child": (lambda t, n: setattr(n["a"], "full_lock", 0), "children's full locks"),
    "lock sum": (lambda t, n: setattr(n["a"], "full_lock", 2), "children's full locks"),
    "lost lock": (lambda t, n: setattr(t, "_locks_outstanding", 2), "outstanding"),
    "id twice": (lambda t, n: setattr(n["c"], "node_id", n["a"].node_id), "seen twice"),
    "cycle": (lambda t, n: n["c"].children.update({("x", n["c"].tokens[:16]): n["c"]}), "seen twice"),
    "unissued id": (lambda t, n: setattr(n["c"], "node_id", 10**6), "never issued"),
    "page index": (lambda t, n: t._page_node.pop(n["a"].page_ids[0]), "page index"),
    "slot index": (lambda t, n: t._slot_node.update({77: n["a"]}), "slot index"),
    "bare root": (lambda t, n: setattr(t.root, "snapshot_slot", 5), "root"),
    "future stamp": (lambda t, n: setattr(n["a"], "full_stamp", t.tick() + 5), "ahead of the clock"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_check_integrity_catches_corruption(name):
    """Each corrupted invariant makes check_integrity raise TreeIntegrityError naming it."""
    tree, nodes = sample_tree()
    corrupt, message = CORRUPTIONS[name]
    corrupt(tree, nodes)
    with pytest.raises(TreeIntegrityError, match=message):
        tree.check_integrity()
