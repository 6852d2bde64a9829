"""Float32 reference of the depthwise causal conv1d used by Gated DeltaNet (kernel width W, usually 4).

``out[t, c] = act(sum_i weight[c, i] * x[t - (W - 1) + i, c])``, where positions before a
sequence's first token read its *conv state*: the last ``W - 1`` inputs of what came before
(zeros for a fresh sequence). The sum is taken in a fixed order, one elementwise step per tap, so
prefill and single-step update compute every position bit-identically (DESIGN.md §3).

Packed variable-length batches: ``x`` is [T, C] with ``cu_seqlens`` offsets; states are
[B, C, W - 1], oldest input first.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mini_engine.ops.invariant import silu

__all__ = ["ConvResult", "causal_conv1d", "causal_conv1d_update"]


class ConvResult(NamedTuple):
    output: torch.Tensor  # [T, C] (prefill) or [B, C] (update)
    final_state: torch.Tensor  # [B, C, W - 1]


def _taps(window: torch.Tensor, weight: torch.Tensor, n_out: int, activation: str | None) -> torch.Tensor:
    """window: [n_out + W - 1, C] inputs; returns [n_out, C]."""
    width = weight.shape[1]
    acc = window[0:n_out] * weight[:, 0]
    for i in range(1, width):
        acc = acc + window[i : i + n_out] * weight[:, i]
    if activation is None:
        return acc
    if activation != "silu":
        raise ValueError(f"activation must be 'silu' or None; got {activation!r}")
    return silu(acc)


def causal_conv1d(
    *, x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None, activation: str | None = "silu",
) -> ConvResult:
    """Prefill over a packed batch. x: [T, C]; weight: [C, W]; initial_state: [B, C, W-1] or None."""
    channels, width = weight.shape
    if x.dim() != 2 or x.shape[1] != channels:
        raise ValueError(f"x must be [T, {channels}]; got {tuple(x.shape)}")
    n_seq = cu_seqlens.numel() - 1
    state_shape = (n_seq, channels, width - 1)
    if initial_state is not None and tuple(initial_state.shape) != state_shape:
        raise ValueError(f"initial_state must be {state_shape}; got {tuple(initial_state.shape)}")
    x, weight = x.float(), weight.float()
    out = torch.empty_like(x)
    finals = []
    for s in range(n_seq):
        lo, hi = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        history = x.new_zeros(width - 1, channels) if initial_state is None else initial_state[s].float().t()
        window = torch.cat([history, x[lo:hi]])
        out[lo:hi] = _taps(window, weight, hi - lo, activation)
        finals.append(window[window.shape[0] - (width - 1):].t())
    final = torch.stack(finals) if finals else x.new_zeros(state_shape)
    return ConvResult(out, final.contiguous())


def causal_conv1d_update(
    *, x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, activation: str | None = "silu"
) -> ConvResult:
    """One decode step for B sequences. x: [B, C]; state: [B, C, W-1]. Returns the new state, input unchanged."""
    window = torch.cat([state.float(), x.float()[:, :, None]], dim=2)  # [B, C, W]
    acc = window[:, :, 0] * weight[:, 0]
    for i in range(1, weight.shape[1]):
        acc = acc + window[:, :, i] * weight[:, i]
    out = acc if activation is None else silu(acc)
    return ConvResult(out, window[:, :, 1:].contiguous())
