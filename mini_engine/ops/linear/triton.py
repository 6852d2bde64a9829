"""A batch-invariant projection in one launch, held to ``inv.linear`` (the reference).

``inv.linear`` keeps a row's result independent of the batch by giving the library gemm one fixed shape:
64-row tiles, one call each. On a GPU a prefill of a few thousand rows is then dozens of launches per
projection, hundreds per layer, all from Python: the engine's prefill was host-bound on the H200 (9,863
gemm launches in a 3.1 s profile). ``linear`` here is one launch for any number of rows. It is batch
invariant by construction: an output element is computed by the program of its (row block, column block),
whose K loop visits the same blocks in the same order whatever the batch, and rows past the batch are
masked to zeros that touch no live row. One configuration per weight dtype (``config_for``), never one
chosen by the row count. Nothing is split over K.

It computes what ``inv.linear`` computes, to rounding: the input cast to the weight's dtype, a float32
accumulator, the result rounded to the weight's dtype and returned in the input's. The float32 form
multiplies as ``mini_engine.ops.precision`` says (3xTF32: float32's accuracy), never plain TF32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mini_engine.ops.precision import dot_precision

__all__ = ["LinearConfig", "config_for", "linear"]


class LinearConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def config_for(dtype: torch.dtype, n_in: int) -> LinearConfig:
    """The one configuration for weights of ``dtype`` with ``n_in`` input features: tensor-core tiles of
    64 rows; 128 columns in 16 bits, 64 in float32 (three products per tile); the widest K
    block of 64, 32 or 16 that divides ``n_in`` (the loop then needs no K mask), else 16, masked."""
    block_k = next((b for b in (64, 32, 16) if n_in % b == 0), 16)
    if dtype == torch.float32:
        return LinearConfig(64, 64, min(block_k, 32))
    return LinearConfig(64, 128, block_k)


@triton.jit(do_not_specialize=["M"])  # one compile for every row count
def _linear_kernel(x, w, out, M, N, K, x_stride, w_stride, out_stride,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                   PRECISION: tl.constexpr):
    """Rows of block program_id(0), columns of block program_id(1). Programs of one column block are
    adjacent in launch order, so they read its weight from L2 after the first."""
    tile_m, tile_n = tl.program_id(0), tl.program_id(1)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    kk = tl.arange(0, BLOCK_K)
    x_tile = x + rows.to(tl.int64)[:, None] * x_stride + kk[None, :]
    w_tile = w + cols.to(tl.int64)[None, :] * w_stride + kk[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_tile, mask=row_ok[:, None], other=0.0)
            b = tl.load(w_tile, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = kk < K - k0
            a = tl.load(x_tile, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w_tile, mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(a.to(w.dtype.element_ty), b, acc, input_precision=PRECISION)
        x_tile += BLOCK_K
        w_tile += BLOCK_K
    result = acc.to(w.dtype.element_ty).to(out.dtype.element_ty)
    target = out + rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(target, result, mask=row_ok[:, None] & col_ok[None, :])


def linear(x: torch.Tensor, weight: torch.Tensor, *, config: LinearConfig | None = None) -> torch.Tensor:
    """``x @ weight.T`` for ``x`` [..., in] (any float dtype) and ``weight`` [out, in] (float32, float16 or
    bfloat16, on x's device); the result [..., out] in x's dtype, rounded through the weight's dtype as
    ``inv.linear`` rounds it. ``config``: default ``config_for`` the weight (the choice that keeps a row's
    bits independent of the batch: pass another only to every call alike)."""
    if weight.dtype not in (torch.float32, torch.float16, torch.bfloat16) or not x.is_floating_point():
        raise ValueError(f"linear takes a float32, float16 or bfloat16 weight and a float input; "
                         f"got {x.dtype} x {weight.dtype}")
    n_out, n_in = weight.shape
    if x.shape[-1] != n_in or x.device != weight.device:
        raise ValueError(f"x must be [..., {n_in}] on {weight.device}; got {tuple(x.shape)} on {x.device}")
    lead = x.shape[:-1]
    rows = x.reshape(-1, n_in)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    out = x.new_empty(rows.shape[0], n_out)
    if rows.shape[0] == 0 or n_out == 0:
        return out.reshape(*lead, n_out)
    config = config or config_for(weight.dtype, n_in)
    grid = (triton.cdiv(rows.shape[0], config.block_m), triton.cdiv(n_out, config.block_n))
    _linear_kernel[grid](rows, weight, out, rows.shape[0], n_out, n_in, rows.stride(0), weight.stride(0),
                         out.stride(0), BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                         EVEN_K=n_in % config.block_k == 0,
                         PRECISION=dot_precision(weight.dtype),
                         num_warps=config.num_warps, num_stages=config.num_stages)
    return out.reshape(*lead, n_out)
