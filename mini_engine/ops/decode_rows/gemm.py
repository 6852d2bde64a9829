"""The decode step's gemm for 16-bit weights, and the per-weight choice between it and cuBLAS.

A decode step multiplies a few live rows by each weight once: a weight-streaming matrix-vector product
in all but name. ``inv.linear`` gives cuBLAS fixed 64-row tiles (batch invariance), most of them padding,
and on the H200 cuBLAS then runs the 1,024-wide outputs at 0.7-1.0 TB/s (split-K over few column
blocks). ``linear`` here gives one program 16 rows (the smallest tensor-core tile) and ``block_n``
columns over all of K; tiles wholly past the batch write their zeros and read no weight.

Which is faster depends on the weight's shape and the device, so ``choose`` times both, and a few
Triton configurations, on the device for one weight and returns the fastest. The choice is made once
per weight and kept: every row of every batch then goes through the same arithmetic, so a row's bits
still never depend on the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mini_engine.ops import invariant as inv

__all__ = ["BLOCK_M", "GemmConfig", "choose", "configs", "linear"]

BLOCK_M = 16  # rows per program, fixed whatever the batch


class GemmConfig(NamedTuple):
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def _linear_kernel(x, w, out, n_live, N, K, x_stride, w_stride, out_stride,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tile_m, tile_n = tl.program_id(0), tl.program_id(1)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if tile_m * BLOCK_M < n_live:  # a tile past the batch holds padding rows alone: zeros, no weight read
        kk = tl.arange(0, BLOCK_K)
        x_tile = x + rows.to(tl.int64)[:, None] * x_stride + kk[None, :]
        w_tile = w + cols.to(tl.int64)[None, :] * w_stride + kk[:, None]
        for _ in range(0, K, BLOCK_K):
            a = tl.load(x_tile)
            b = tl.load(w_tile, mask=col_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc)
            x_tile += BLOCK_K
            w_tile += BLOCK_K
    tl.store(out + rows.to(tl.int64)[:, None] * out_stride + cols[None, :], acc.to(out.dtype.element_ty),
             mask=col_ok[None, :])


def configs(n_out: int, n_in: int) -> list[GemmConfig]:
    """Candidate configurations for a weight [n_out, n_in] (the first is the default): column blocks of 16,
    32 or 64 with at least 32 of them, K blocks of 256 or 128 that divide ``n_in``."""
    block_ks = [b for b in (256, 128, 64, 32, 16) if n_in % b == 0][:2]
    if not block_ks:
        raise ValueError(f"linear needs in_features divisible by 16; got {n_in}")
    block_ns = [b for b in (64, 32, 16) if triton.cdiv(n_out, b) >= 32] or [16]
    return [GemmConfig(n, k) for n in block_ns for k in block_ks]


def linear(x: torch.Tensor, weight: torch.Tensor, *, rows: int, config: GemmConfig | None = None) -> torch.Tensor:
    """``x @ weight.T`` for x [P, K] (P a multiple of 16, rows past ``rows`` zero) and a 16-bit weight [N, K]
    of x's dtype; returns [P, N] in that dtype, rows past ``rows`` zero. Accumulates in float32.
    ``config``: default the first of ``configs``."""
    if weight.dtype not in (torch.float16, torch.bfloat16) or x.dtype != weight.dtype:
        raise ValueError(f"linear takes a 16-bit weight and input of its dtype; got {x.dtype} x {weight.dtype}")
    padded, n_in = x.shape
    if weight.dim() != 2 or weight.shape[1] != n_in or weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"weight must be [N, {n_in}] and both contiguous along K; got {tuple(weight.shape)}, "
                         f"strides {weight.stride()} and {x.stride()}")
    if padded % BLOCK_M or not 0 <= rows <= padded:
        raise ValueError(f"x must have a multiple of {BLOCK_M} rows and rows in [0, {padded}]; got {padded} and {rows}")
    n_out = weight.shape[0]
    config = config or configs(n_out, n_in)[0]
    if n_in % config.block_k:
        raise ValueError(f"block_k={config.block_k} must divide in_features={n_in}")
    out = x.new_empty(padded, n_out)
    if padded:
        _linear_kernel[(padded // BLOCK_M, triton.cdiv(n_out, config.block_n))](
            x, weight, out, rows, n_out, n_in, x.stride(0), weight.stride(0), out.stride(0),
            BLOCK_M=BLOCK_M, BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
            num_stages=config.num_stages)
    return out


_CHOSEN: dict[tuple, GemmConfig | None] = {}  # (shape, dtype, device) -> choice: once per process


def choose(weight: torch.Tensor, *, batches: tuple[int, ...] = (1, 32), reps: int = 15) -> GemmConfig | None:
    """The fastest way to run ``weight`` in a decode step on its CUDA device: a ``GemmConfig`` for ``linear``,
    or None for ``inv.linear`` (cuBLAS). Each candidate is timed on ``batches`` live rows of a padded 64-row
    input (the step's shape), the median of ``reps`` runs each behind a spin kernel (so host launch time is
    not counted) and an L2 flush (so the weight comes from memory, as in a step); ranked by the summed
    medians. Weights of one shape, dtype and device share one choice, kept for the process."""
    key = (tuple(weight.shape), weight.dtype, weight.device)
    if key in _CHOSEN:
        return _CHOSEN[key]
    inputs = {b: torch.zeros(inv.ROW_TILE, weight.shape[1], dtype=weight.dtype, device=weight.device) for b in batches}
    for b, x in inputs.items():
        x[:b].normal_()
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device=weight.device)

    def run(config: GemmConfig | None, b: int) -> None:
        if config is None:
            inv.linear(inputs[b], weight)
        else:
            linear(inputs[b], weight, rows=b, config=config)

    def milliseconds(config: GemmConfig | None) -> float:
        total = 0.0
        for b in batches:
            run(config, b)  # compile, warm
            times = []
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(_SPIN_CYCLES)
                flush.zero_()
                start.record()
                run(config, b)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            total += sorted(times)[reps // 2]
        return total

    _CHOSEN[key] = min([None, *configs(*weight.shape)], key=milliseconds)
    return _CHOSEN[key]


_L2_FLUSH_BYTES = 128 << 20  # more than the H200's 50 MB of L2
_SPIN_CYCLES = 200_000  # ~100 us of device time: the launches queue behind it
