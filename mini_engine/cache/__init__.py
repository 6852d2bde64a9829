"""Cache bookkeeping in plain Python (no torch): slot and page allocators, the hybrid radix tree."""

from mini_engine.cache.pools import IntegrityError, Owner, OwnershipError, PagePool, PoolExhausted, SlotPool
from mini_engine.cache.radix import EvictResult, InsertResult, MatchResult, RadixNode, RadixTree, TreeIntegrityError

__all__ = [
    "EvictResult",
    "InsertResult",
    "IntegrityError",
    "MatchResult",
    "Owner",
    "OwnershipError",
    "PagePool",
    "PoolExhausted",
    "RadixNode",
    "RadixTree",
    "SlotPool",
    "TreeIntegrityError",
]
