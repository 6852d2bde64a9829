"""Gated delta rule: chunked (prefill, x64 boundary states) and recurrent (decode) forms."""

from mini_engine.ops.gated_delta_rule.reference import (
    CHUNK,
    GdnResult,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
)

__all__ = ["CHUNK", "GdnResult", "chunk_gated_delta_rule", "recurrent_gated_delta_rule"]
