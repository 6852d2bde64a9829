"""The per-row pieces of a decode step (norms, gates, RoPE, activations) on padded rows; the Triton
kernels are in ``triton.py``."""

from mini_engine.ops.decode_rows.reference import (
    add_rms_norm,
    decode_prologue,
    gated_rms_norm,
    gdn_rows,
    qk_norm_rope,
    sigmoid_mul,
    silu_mul,
)

__all__ = ["add_rms_norm", "decode_prologue", "gated_rms_norm", "gdn_rows", "qk_norm_rope", "sigmoid_mul", "silu_mul"]
