"""Causal attention of new queries over a cached prefix plus new keys (prefill and decode alike)."""

from mini_engine.ops.attention.reference import TILE, attention_with_prefix, gather_pages

__all__ = ["TILE", "attention_with_prefix", "gather_pages"]
