"""Operators, one folder each: a float32 PyTorch reference (the specification), kernels beside it later.

Call them by keyword.
"""

from mini_engine.ops.attention import attention_with_prefix
from mini_engine.ops.causal_conv1d import causal_conv1d, causal_conv1d_update
from mini_engine.ops.checksum import slot_checksum
from mini_engine.ops.gated_delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule

__all__ = [
    "attention_with_prefix",
    "causal_conv1d",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "recurrent_gated_delta_rule",
    "slot_checksum",
]
