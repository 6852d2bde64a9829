"""Batch-invariant float32 primitives: the oracle's foundation (DESIGN.md §3, "Exactness").

A hit is judged against its cold reference token for token, so a row's result must not depend on
which other rows share the call. On this CPU stack that is false for the obvious ops, measured:

- MKL's sgemm gives a row a different result depending on how many rows are in the call (M=1 is a
  gemv; M>=2 picks blockings by M). A gemm of one *fixed* shape is row-position invariant, and a
  batched matmul of fixed per-matrix shape is invariant to the batch count. So linear layers run in
  fixed tiles of ``ROW_TILE`` rows, and the small matmuls inside attention and the gated delta rule
  use ``torch.bmm`` on contiguous operands of fixed shape.
- ATen's vectorised loops process a tensor's tail with the scalar op, and for sigmoid / silu /
  softplus the scalar and the vector formulas differ in the last ulp, so an element's value depends
  on where it sits in the tensor. ``exp``, ``log``, ``log1p``, ``rsqrt`` and division agree in both
  paths, so the activations are composed from those.

Reductions used here run over a contiguous last dimension of fixed length, which ATen computes in
one fixed order per row. ``tests/unit/test_invariant.py`` checks every primitive against these
claims; if a new torch build breaks one, that test fails before any oracle can lie.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

__all__ = [
    "ROW_TILE",
    "relaxed",
    "linear",
    "bmm",
    "sigmoid",
    "silu",
    "softplus",
    "rms_norm",
    "l2_normalize",
    "rope",
]

ROW_TILE = 64
_RELAXED = [False]


@contextmanager
def relaxed():
    """Inside: ``linear`` is one plain matmul (not batch-invariant). For training code only; the
    engine never enters it. Not thread-safe: it is a process-wide switch."""
    before = _RELAXED[0]
    _RELAXED[0] = True
    try:
        yield
    finally:
        _RELAXED[0] = before
SOFTPLUS_THRESHOLD = 20.0


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` for ``x`` of shape [..., in], computed in fixed tiles of ``ROW_TILE`` rows.

    Every tile is one gemm of shape [ROW_TILE, in] x [in, out], so a row's result is the same
    whether it is computed alone or inside any batch. Rows already a multiple of the tile are used as
    they are (the decode step keeps its rows padded). A weight of another dtype (bfloat16 projections
    under a float32 residual stream) gets ``x`` in its dtype, and the result comes back in ``x``'s.
    Under autograd or inside ``relaxed()`` (training and its evaluations, where nothing is compared
    bit for bit) it is one matmul: ``out=`` gemms record no gradient, and tiles cost a launch each on a GPU.
    """
    if _RELAXED[0] or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return x @ weight.t()
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1]).to(weight.dtype)
    n = rows.shape[0]
    padded_n = -(-n // ROW_TILE) * ROW_TILE
    if padded_n == 0:
        return x.new_zeros(*lead, weight.shape[0])
    if padded_n != n:
        padded = rows.new_zeros(padded_n, rows.shape[1])
        padded[:n] = rows
        rows = padded
    rows = rows.contiguous()  # (a no-op but for strided views: the gemm sees one layout, always)
    out = rows.new_empty(padded_n, weight.shape[0])
    weight_t = weight.t()
    for start in range(0, padded_n, ROW_TILE):
        torch.mm(rows[start : start + ROW_TILE], weight_t, out=out[start : start + ROW_TILE])
    return out[:n].reshape(*lead, weight.shape[0]).to(x.dtype)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched matmul over leading dims with both operands made contiguous (fixed per-matrix shape)."""
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a3 = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:]).contiguous()
    b3 = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:]).contiguous()
    return torch.bmm(a3, b3).reshape(*lead, a.shape[-2], b.shape[-1])


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def softplus(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(x))``, linear above the same threshold torch uses (20)."""
    return torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x.clamp(max=SOFTPLUS_THRESHOLD))))


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps)`` over the last dim (no weight)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, as flash-linear-attention and HF compute it."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [N, heads, head_dim] at ``positions`` [N] on its first ``2 * len(inv_freq)``
    channels; the rest pass through."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]
    dim = angles.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    rotated = torch.cat([-rot[..., dim // 2 :], rot[..., : dim // 2]], dim=-1)
    return torch.cat([rot * angles.cos() + rotated * angles.sin(), rest], dim=-1)
