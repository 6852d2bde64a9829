"""Builders shared by the radix tree tests."""

import itertools


_ids = itertools.count(1000)


def fresh(n):
    return tuple(next(_ids) for _ in range(n))


def toks(n, start=0):
    return list(range(start, start + n))


def put(tree, tokens, key="", slot=None, **kwargs):
    result = tree.insert(tokens, key, fresh(len(tokens) // tree.page_size), slot, **kwargs)
    tree.check_integrity()
    return result


def node_ids(tree):
    return set(tree.pages().values())


def depth(node):
    """Tokens from the root to the end of ``node``'s span."""
    return len(node.tokens) + (depth(node.parent) if node.parent else 0)
