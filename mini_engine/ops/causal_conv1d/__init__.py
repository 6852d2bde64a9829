"""Depthwise causal conv1d: packed prefill and single-step update, both carrying the conv state."""

from mini_engine.ops.causal_conv1d.reference import ConvResult, causal_conv1d, causal_conv1d_update

__all__ = ["ConvResult", "causal_conv1d", "causal_conv1d_update"]
