"""The decode step's gemm for 16-bit weights, and the per-weight choice between it and cuBLAS.

A decode step multiplies a few live rows by each weight once: a weight-streaming matrix-vector product
in all but name. ``inv.linear`` gives cuBLAS fixed 64-row tiles (batch invariance), most of them padding,
and on the H200 cuBLAS then runs the 1,024-wide outputs at 0.7-1.0 TB/s (split-K over few column
blocks). ``linear`` here gives one program 16 rows (the smallest tensor-core tile) and ``block_n``
columns over all of K, or over a fixed part of K (``split_k``: the parts' float32 sums added in a fixed
order by a second launch, or by the kernel that reads the output: ``unsummed``, which the decode step's
residual norm takes, so a split of a 1,024-wide output costs no launch of its own); tiles wholly past the
batch write their zeros and read no weight. With ``swap``
the same tile is computed as weight @ x.T: the weight's ``block_n`` rows are the tensor-core tile's long
side (Hopper's warpgroup products take 64 rows there) and the 16 input rows its short one, the weight
loaded by address or (``tma``) by a tensor descriptor, as decode kernels for small batches do. In a CUDA
graph each kernel costs about 3 us of its own on an H100, whatever it streams (session 12); the TMA tile as a
programmatic dependent launch (``pdl``: ``ops.pdl``) overlaps that with the kernel before it (the step's 97
gemms in one graph 652 us against 709, H100, session 13), and ``DecodeModel(pdl=True)`` launches every Triton
gemm of the step so. A split whose parts the tile's last program adds in the same launch (``fused_sum``) is
not offered: it won one shape of six, by address, where the whole-K TMA tile was faster still.

The swapped tile over all of K may also apply the MLP's activation to what it computes (``swiglu``): the gate | up
weight holds its gate and up rows 32 at a time (``FusedProjection(block=32)``), so a tile's 64 weight rows are the
gate and the up of the same 32 columns, and its epilogue stores SiLU(gate) * up (``silu_mul``'s arithmetic on the
tile rounded as its store would round it: the same bits) where a second launch would. Only the epilogue changes: the
loads and dots stream as before (an activation between them, in the down projection's input tiles, had cost the TMA
tile its pipelining: 11 us a projection on an H100, session 12).

Such a launch may also ask the L2 for its weight rows before its wait (``prefetch``), so the bytes it streams start
coming while the kernel before still runs, where the wait alone overlaps only the launch. It is not among the
candidates: in a graph of one shape's gemms it is faster for the 1,024-wide outputs (H100, session 21: 4.8 -> 3.9
us and 7.1 -> 5.8 us a gemm; the wide ones and the head gain nothing), and the tuner chose it for them, but the
engine's decode step with those choices ran 4-5 % slower at batch 1 (797-810 against 829-839 tok/s, four
alternating rounds in two calls; the head's choice ruled out). What it costs in the step (its programs resident and
waiting beside the kernel before, its early reads against that kernel's) is not measured. Those runs asked for
each program's whole part of its rows; ``prefetch`` is a number of columns, so a launch may ask for only its first
pipeline stages: the first two (``2 * block_k``) on the same two weights lost too, by less (823-827 against 831-832
tok/s, session 22). ``decode_gemms.py`` times both beside their twin.

Which is faster depends on the weight's shape and the device, so ``choose`` times both, and a few
Triton configurations, on the device for one weight, in a CUDA graph as a step runs them, and returns
the fastest. The choice is made once
per weight and kept: every row of every batch then goes through the same arithmetic, so a row's bits
still never depend on the batch. Timings vary between processes, and so may the choice: ``decode_rows.tuned``
keeps choices measured ahead of time per GPU model, the same in every process.

One choice serves every batch, and the fastest at one batch need not be at another: ``rank`` sums the batches'
times (by default 1 and 32), ``rank_by_batch`` keeps them apart. On an H100 (session 27) the three widest layer
weights (8224, 7168 and 5120 x 1024) ran fastest as the dependent-launch tile at batch 1 (8.26, 7.46 and 6.14 us
against cuBLAS's 8.60, 8.48 and 6.79) and on cuBLAS at batch 32 (8.95, 8.10 and 7.08 against 9.73, 8.70 and 7.64).
The H200's table, ranked on the sum (session 18), had cuBLAS for those three; on the H100 the same choice cost the
engine's decode 4.3 % at batch 1 (797-803 against 835-838 tok/s) and changed batch 32 by -0.2 to +3.3 %. Ranked at
batch 1 on an H200 (session 29) the tile won all seven of the 0.8B's weights: the engine's batch 1 954.4 against
896.7 tok/s, batch 32 18,711 against 19,443; the packaged H200 table has the batch-1 ranking since.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mini_engine.ops import invariant as inv
from mini_engine.ops import pdl
from mini_engine.ops.counters import counters as tile_counters
from mini_engine.ops.decode_rows.triton import Parts, silu_times

__all__ = ["BLOCK_M", "GemmConfig", "choose", "configs", "fuses_swiglu", "graph_microseconds", "linear", "past_l2",
           "rank", "rank_by_batch", "swiglu"]

BLOCK_M = 16  # rows per program, fixed whatever the batch


class GemmConfig(NamedTuple):
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1  # K in this many fixed parts, their float32 partial sums added in a fixed order
    swap: bool = False  # the weight tile as the product's left operand: out.T = weight @ x.T (``_swapped_kernel``)
    tma: bool = False  # with ``swap``: the weight tiles come through a tensor descriptor (Hopper's TMA engine)
    pdl: bool = False  # with ``swap``: always a programmatic dependent launch (``ops.pdl``), in a step or not
    fused_sum: bool = False  # with ``swap`` and split_k > 1: the parts added by the tile's last program, one launch
    # with ``pdl``: the columns of each of its weight rows (from its K part's start; 0 none, its whole part at most) a
    # program asks the L2 for before its wait (``_prefetch``); a multiple of 8
    prefetch: int = 0


@triton.jit
def _program_tile(N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's row tile, column tile and K part (grid axes 0, 1, 2), its rows and columns, and which
    columns are inside the weight's N."""
    tile_m, tile_n, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return tile_m, tile_n, part, rows, cols, cols < N


@triton.jit(do_not_specialize=["n_live"])  # one compile for every batch size
def _linear_kernel(x, w, out, n_live, N, K_PART, x_stride, w_stride, out_stride, part_stride,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                   PDL: tl.constexpr = False):
    """Rows tile_m, columns tile_n, K part ``part`` (of K_PART columns); with SPLIT > 1 ``out`` is the float32
    partial-sum buffer [SPLIT, P, N] and ``_sum_parts_kernel`` adds the parts."""
    pdl.begin(PDL)
    tile_m, _, part, rows, cols, col_ok = _program_tile(N, BLOCK_M, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if tile_m * BLOCK_M < n_live:  # a tile past the batch holds padding rows alone: zeros, no weight read
        kk = part.to(tl.int64) * K_PART + tl.arange(0, BLOCK_K)
        x_tile = x + rows.to(tl.int64)[:, None] * x_stride + kk[None, :]
        w_tile = w + cols.to(tl.int64)[None, :] * w_stride + kk[:, None]
        for _ in range(0, K_PART, BLOCK_K):
            a = tl.load(x_tile)
            b = tl.load(w_tile, mask=col_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc)
            x_tile += BLOCK_K
            w_tile += BLOCK_K
    target = out + part.to(tl.int64) * part_stride + rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(target, acc.to(out.dtype.element_ty), mask=col_ok[None, :])


@triton.jit
def _prefetch(weight, cols, N, k0, columns, w_stride):
    """Ask the L2 for this program's weight rows ``cols`` (those past N read as the last), columns k0..k0 + columns:
    one bulk prefetch a row (sm_90 on). It neither waits nor writes: the loads after it find the rows in the L2, or
    on their way there."""
    start = weight + tl.minimum(cols, N - 1).to(tl.int64) * w_stride + k0
    size = tl.full(cols.shape, 0, tl.int32) + columns * weight.dtype.element_ty.primitive_bitwidth // 8
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                              [start, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit(do_not_specialize=["n_live"])
def _swapped_kernel(x, w, weight, out, n_live, N, K_PART, x_stride, w_stride, out_stride, part_stride, final,
                    counters, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr,
                    SPLIT: tl.constexpr, FUSED_SUM: tl.constexpr, PREFETCH: tl.constexpr = 0,
                    SWIGLU: tl.constexpr = False, PDL: tl.constexpr = False):
    """``_linear_kernel``'s tile with the operands swapped: the product's M side is the weight's BLOCK_N rows
    (a tensor-core tile as wide as the weight's, not the batch's 16 rows), its N side the 16 input rows. ``w``
    is the weight's pointer, or with TMA a tensor descriptor of [BLOCK_N, BLOCK_K] blocks (rows past N read as
    zeros). Writes ``out`` (or the parts) in ``_linear_kernel``'s layout. With PDL the kernel was launched as a
    programmatic dependent launch, so it may start while the kernel before it still runs: it waits for that
    kernel to finish (griddepcontrol.wait: its writes visible) before it reads or writes anything, then lets the
    next kernel launch at once (a dependent launched so waits in turn for this one to finish).

    With FUSED_SUM (K in SPLIT parts), ``out`` is the parts buffer and the tile's parts are added in one launch:
    each program stores its part, then counts itself in on the tile's counter (``counters``, zero at rest); the
    program that counts last adds the SPLIT parts in order 0, 1, ... (``_sum_parts_kernel``'s order, so the same
    bits) into ``final`` and sets the counter back to zero for the next launch.

    With PREFETCH > 0 (a dependent launch) the program first asks the L2 for the first PREFETCH columns of its part
    of its weight rows (``weight``: the weight's own pointer, whether or not ``w`` is its descriptor), then waits, so
    those bytes come from memory while the kernel before still runs. Nothing reaches the program before the wait:
    the L2 is where every SM's writes land, so a line fetched early is still the latest when the program reads it
    (and the weights are the step's constants, which nothing writes). Everything is read after the wait, as
    without it.

    With SWIGLU (K whole) the tile's BLOCK_N weight rows are BLOCK_N / 2 gate rows then the up rows of the same
    columns (``FusedProjection(block=BLOCK_N // 2)``), and ``out`` [P, N / 2] gets SiLU(gate) * up of them: the
    tile rounded to x's dtype as its store would, then ``silu_mul``'s arithmetic, rounded to ``out``'s dtype."""
    tile_m, tile_n, part, rows, cols, col_ok = _program_tile(N, BLOCK_M, BLOCK_N)
    live = tile_m * BLOCK_M < n_live  # a tile past the batch holds padding rows alone: zeros, no weight read
    if PREFETCH > 0 and PDL:  # noqa: SIM102 (a constexpr: compiled out, apart from the live check at run time)
        if live:
            _prefetch(weight, cols, N, part * K_PART, tl.minimum(K_PART, PREFETCH), w_stride)
    pdl.begin(PDL)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if live:
        k0 = part * K_PART
        kk = k0.to(tl.int64) + tl.arange(0, BLOCK_K)
        x_tile = x + rows.to(tl.int64)[None, :] * x_stride + kk[:, None]
        w_tile = w
        if not TMA:
            w_tile = w + cols.to(tl.int64)[:, None] * w_stride + kk[None, :]
        for k in range(0, K_PART, BLOCK_K):
            if TMA:
                b = w.load([tile_n * BLOCK_N, k0 + k])
            else:
                b = tl.load(w_tile, mask=col_ok[:, None], other=0.0)
                w_tile += BLOCK_K
            acc = tl.dot(b, tl.load(x_tile), acc)
            x_tile += BLOCK_K
    if SWIGLU:
        rounded = acc.to(x.dtype.element_ty).to(tl.float32)
        gate, up = tl.split(tl.permute(tl.reshape(rounded, [2, BLOCK_N // 2, BLOCK_M]), [1, 2, 0]))
        act_cols = tile_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out + rows.to(tl.int64)[None, :] * out_stride + act_cols[:, None],
                 silu_times(gate, up).to(out.dtype.element_ty))
    else:
        target = out + part.to(tl.int64) * part_stride + rows.to(tl.int64)[None, :] * out_stride + cols[:, None]
        tl.store(target, acc.to(out.dtype.element_ty), mask=col_ok[:, None])
    if FUSED_SUM:
        tile = counters + tile_m * tl.num_programs(1) + tile_n
        tl.debug_barrier()  # every thread's part stored before the count that publishes it (release, gpu scope)
        if tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
            first = out + rows.to(tl.int64)[None, :] * out_stride + cols[:, None]
            total = tl.load(first, mask=col_ok[:, None], other=0.0, cache_modifier=".cg")
            for other in tl.static_range(1, SPLIT):
                total += tl.load(first + other * part_stride, mask=col_ok[:, None], other=0.0, cache_modifier=".cg")
            tl.store(final + rows.to(tl.int64)[None, :] * out_stride + cols[:, None],
                     total.to(final.dtype.element_ty), mask=col_ok[:, None])
            tl.atomic_xchg(tile, 0)


@triton.jit
def _sum_parts_kernel(parts, out, N, part_stride, out_stride, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
                      PDL: tl.constexpr = False):
    """Row r of ``out``: the SPLIT partial sums of the row added in order 0, 1, ..., then cast."""
    pdl.begin(PDL)
    row, tile = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    total = tl.load(parts + row * out_stride + cols, mask=ok, other=0.0)
    for part in tl.static_range(1, SPLIT):
        total += tl.load(parts + part * part_stride + row * out_stride + cols, mask=ok, other=0.0)
    tl.store(out + row * out_stride + cols, total.to(out.dtype.element_ty), mask=ok)


def configs(n_out: int, n_in: int) -> list[GemmConfig]:
    """Candidate configurations for a weight [n_out, n_in] (the first is the default): column blocks of 16,
    32 or 64 with at least 32 of them, K blocks of 256 or 128 that divide ``n_in``; for outputs of at most
    2,048 columns (too few column blocks to keep the memory busy) also K split in 2 or 4 parts. Then the
    swapped tile on 64 weight rows, by address and by descriptor (also as a dependent launch), over all of K and
    (narrow outputs) in 4 or 8 parts (8: for the decode step's mixer and down projections, whose parts the residual's
    norm adds in no launch of their own, so more programs stream the weight at no second launch's cost). Not the
    dependent launch that asks for its weight early (``prefetch``): timed alone it wins, in the engine's step it
    loses (the module's docstring). (Narrower swapped tiles, 32 or 16 weight rows by descriptor, ran 1.2-1.5x slower
    on an H100: session 12.) The gate | up weight's tile of 64 rows also serves ``swiglu``."""
    block_ks = [b for b in (256, 128, 64, 32, 16) if n_in % b == 0][:2]
    if not block_ks:
        raise ValueError(f"linear needs in_features divisible by 16; got {n_in}")
    block_ns = [b for b in (64, 32, 16) if triton.cdiv(n_out, b) >= 32] or [16]
    out = [GemmConfig(n, k) for n in block_ns for k in block_ks]
    if n_out <= 2048:
        out += [GemmConfig(n, k, split_k=split) for split in (2, 4) for n in (64, 32)
                for k in (128, 64) if n_in % (split * k) == 0]
    swapped = [(1, block_ks[0])]
    if n_out <= 2048:
        for split in (4, 8):
            swapped += [(split, k) for k in (128, 64) if n_in % (split * k) == 0][:1]
    out += [GemmConfig(64, k, split_k=split, swap=True, tma=tma, pdl=dependent) for split, k in swapped
            for tma, dependent in ((False, False), (True, False), (True, True))]
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, *, rows: int, config: GemmConfig | None = None,
           unsummed: bool = False) -> torch.Tensor | Parts:
    """``x @ weight.T`` for x [P, K] (P a multiple of 16, rows past ``rows`` zero) and a 16-bit weight [N, K]
    of x's dtype; returns [P, N] in that dtype, rows past ``rows`` zero. Accumulates in float32.
    ``config``: default the first of ``configs``.

    ``unsummed``: a split's K parts are returned as they are (``Parts``, float32 [split, P, N]) for the kernel that
    reads them to add (``decode_rows.add_rms_norm``, which adds them as the second launch would: the same bits), so
    the split costs no launch of its own. A configuration without a second launch returns its output as ever."""
    return _gemm(x, weight, rows, config or configs(*weight.shape)[0], unsummed=unsummed)


def fuses_swiglu(config: GemmConfig | None, weight: torch.Tensor, block: int | None) -> bool:
    """Whether ``swiglu`` runs ``config`` for ``weight``, an MLP's gate | up taken ``block`` rows at a time
    (``FusedProjection(block=)``): the swapped tile over all of K whose weight rows are a block of gate and of up."""
    return (config is not None and block is not None and config.swap and config.split_k == 1
            and config.block_n == 2 * block and weight.shape[0] % config.block_n == 0)


def swiglu(x: torch.Tensor, weight: torch.Tensor, *, rows: int, config: GemmConfig, block: int,
           out_dtype: torch.dtype) -> torch.Tensor:
    """``silu_mul(gate_up=linear(x, weight, rows=rows, config=config), out_dtype=out_dtype, live=rows, block=block)``
    in the gemm's one launch, with its bits: [P, N / 2] in ``out_dtype``, rows past ``rows`` zero. ``weight``: the
    MLP's gate | up as ``FusedProjection(block=block)`` lays it out; ``config``: one that ``fuses_swiglu``."""
    if not fuses_swiglu(config, weight, block):
        raise ValueError(f"swiglu applies SiLU(gate) * up in the swapped tile's epilogue: it needs swap=True, "
                         f"split_k=1 and block_n = 2 * block dividing the weight's {weight.shape[0]} rows; got "
                         f"{config}, block={block}")
    return _gemm(x, weight, rows, config, act_dtype=out_dtype)


def _gemm(x: torch.Tensor, weight: torch.Tensor, rows: int, config: GemmConfig, *, unsummed: bool = False,
          act_dtype: torch.dtype | None = None) -> torch.Tensor | Parts:
    """``linear``'s launches; with ``act_dtype``, ``swiglu``'s."""
    if weight.dtype not in (torch.float16, torch.bfloat16) or x.dtype != weight.dtype:
        raise ValueError(f"linear takes a 16-bit weight and input of its dtype; got {x.dtype} x {weight.dtype}")
    padded, n_in = x.shape
    if weight.dim() != 2 or weight.shape[1] != n_in or weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"weight must be [N, {n_in}] and both contiguous along K; got {tuple(weight.shape)}, "
                         f"strides {weight.stride()} and {x.stride()}")
    if padded % BLOCK_M or not 0 <= rows <= padded:
        raise ValueError(f"x must have a multiple of {BLOCK_M} rows and rows in [0, {padded}]; got {padded} and {rows}")
    n_out = weight.shape[0]
    if n_in % (config.block_k * config.split_k):
        raise ValueError(f"block_k={config.block_k} x split_k={config.split_k} must divide in_features={n_in}")
    if config.tma and not (config.swap and weight.data_ptr() % 16 == 0):
        raise ValueError(f"tma=True loads the weight as the swapped kernel's left operand by a descriptor: it needs "
                         f"swap=True and a 16-byte aligned weight; got {config} and address {weight.data_ptr()}")
    if config.fused_sum and not (config.swap and config.split_k > 1):
        raise ValueError(f"fused_sum=True adds the swapped kernel's K parts in its own launch: it needs swap=True and "
                         f"split_k > 1; got {config}")
    if config.pdl and not (config.swap and pdl.available()):
        raise ValueError(f"pdl=True is the swapped kernel's programmatic dependent launch: it needs swap=True and a "
                         f"triton with triton.language.extra.cuda.gdc_wait (3.4 on); got {config}, triton "
                         f"{triton.__version__}")
    if config.prefetch and not (config.pdl and config.prefetch > 0 and config.prefetch % 8 == 0):
        raise ValueError(f"prefetch=N asks the L2 for N columns of each weight row before a dependent launch's wait: "
                         f"it needs pdl=True and N a positive multiple of 8 (whole 16-byte pieces); got {config}")
    out = x.new_empty(padded, n_out) if act_dtype is None else x.new_empty(padded, n_out // 2, dtype=act_dtype)
    if not padded:
        return out
    split = config.split_k
    parts = out if split == 1 else torch.empty(split, padded, n_out, dtype=torch.float32, device=x.device)
    grid = (padded // BLOCK_M, triton.cdiv(n_out, config.block_n), split)
    shared = (n_out, n_in // split, x.stride(0), weight.stride(0), out.stride(0), 0 if split == 1 else parts.stride(0))
    blocks = {"BLOCK_M": BLOCK_M, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
              "num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.swap:
        if config.tma:  # (made per call: the launcher encodes a descriptor per launch anyway; a graph keeps it)
            from triton.tools.tensor_descriptor import TensorDescriptor

            w = TensorDescriptor.from_tensor(weight, [config.block_n, config.block_k])
        else:
            w = weight
        # a dependent launch by its configuration or inside the decode step's ``pdl.launches(True)``
        dependent = pdl.options(always=config.pdl)
        counters = tile_counters(grid[0] * grid[1], x.device) if config.fused_sum else parts
        _swapped_kernel[grid](x, w, weight, parts, rows, *shared, out, counters, TMA=config.tma, SPLIT=split,
                              FUSED_SUM=config.fused_sum, PREFETCH=config.prefetch, SWIGLU=act_dtype is not None,
                              **blocks, **dependent)
    else:
        _linear_kernel[grid](x, weight, parts, rows, *shared, SPLIT=split, **blocks, **pdl.options())
    if split > 1 and not config.fused_sum:
        if unsummed:
            return Parts(parts, out.dtype)
        block = min(1024, triton.next_power_of_2(n_out))
        _sum_parts_kernel[(padded, triton.cdiv(n_out, block))](parts, out, n_out, parts.stride(0), n_out,
                                                             SPLIT=split, BLOCK=block, **pdl.options())
    return out


_CHOSEN: dict[tuple, GemmConfig | None] = {}  # (shape, dtype, device) -> choice: once per process


def choose(weight: torch.Tensor, *, batches: tuple[int, ...] = (1, 32), repeats: int = 15,
           unsummed: bool = False) -> GemmConfig | None:
    """The fastest way to run ``weight`` in a decode step on its CUDA device (``rank``'s first): a ``GemmConfig``
    for ``linear``, or None for ``inv.linear`` (cuBLAS). Weights of one shape, dtype and device share one choice,
    kept for the process (and ``unsummed``: ``rank_by_batch``'s)."""
    key = (tuple(weight.shape), weight.dtype, weight.device, unsummed)
    if key not in _CHOSEN:
        _CHOSEN[key] = rank(weight, batches=batches, repeats=repeats, unsummed=unsummed)[0][0]
    return _CHOSEN[key]


def rank(weight: torch.Tensor, *, batches: tuple[int, ...] = (1, 32), repeats: int = 15, unsummed: bool = False
         ) -> list[tuple[GemmConfig | None, float]]:
    """Every candidate for ``weight`` (None: cuBLAS, then ``configs``) with its microseconds summed over ``batches``,
    fastest first (``rank_by_batch``)."""
    return [(config, sum(times.values()))
            for config, times in rank_by_batch(weight, batches=batches, repeats=repeats, unsummed=unsummed)]


def rank_by_batch(weight: torch.Tensor, *, batches: tuple[int, ...] = (1, 32), repeats: int = 15,
                  unsummed: bool = False) -> list[tuple[GemmConfig | None, dict[int, float]]]:
    """Every candidate for ``weight`` (None: cuBLAS, then ``configs``) with its microseconds at each of ``batches``,
    fastest first by their sum. Each runs as a step runs it: on that many live rows of a padded 64-row input, one
    gemm after another in a CUDA graph, each on its own copy of the weight (copies past the L2's size, so the weight
    comes from memory), timed per gemm (``graph_microseconds``). Timed alone between two events, a gemm of a few
    microseconds carries the events' own and is overstated unevenly between candidates. TMA and dependent-launch
    candidates only where the device has them (sm_90 on). The sum is a choice between the batches: one weight gets
    one choice at every batch (a row's bits must not depend on its batch), and the fastest at one batch need not be
    at another (the module's docstring). ``unsummed``: the weight's output is read by a kernel that adds a split's
    parts itself (``linear(unsummed=True)``: the decode step's mixer and down projections), so a split is timed
    without its second launch."""
    inputs = {b: torch.zeros(inv.ROW_TILE, weight.shape[1], dtype=weight.dtype, device=weight.device) for b in batches}
    for b, x in inputs.items():
        x[:b].normal_()
    copies = [weight] + [weight.clone() for _ in range(past_l2(weight) - 1)]

    def run(config: GemmConfig | None, b: int, w: torch.Tensor) -> None:
        if config is None:
            inv.linear(inputs[b], w)
        else:
            linear(inputs[b], w, rows=b, config=config, unsummed=unsummed)

    def microseconds(config: GemmConfig | None) -> dict[int, float]:
        return {b: graph_microseconds([lambda w=w, b=b: run(config, b, w) for w in copies], repeats) / len(copies)
                for b in batches}

    hopper = torch.cuda.get_device_capability(weight.device) >= (9, 0)  # TMA descriptors need sm_90 or later
    candidates = [c for c in configs(*weight.shape) if hopper or not (c.tma or c.pdl)]
    return sorted(((config, microseconds(config)) for config in [None, *candidates]),
                  key=lambda pair: sum(pair[1].values()))


def past_l2(weight: torch.Tensor) -> int:
    """How many copies of ``weight`` a timing cycles through so that none is still in the L2 when it comes round
    again: their bytes past ``_L2_BYTES`` twice over (at least one, at most 256)."""
    return max(1, min(256, -(-2 * _L2_BYTES // (weight.numel() * weight.element_size()))))


def graph_microseconds(calls: list, repeats: int = 20) -> float:
    """Microseconds of running ``calls`` in order as one CUDA graph (each called once first: compiled and warm,
    outside the capture): the median of ``repeats`` replays, each between two events. What a sequence of
    kernels costs inside a graphed decode step, where one kernel's launch hides behind the one before."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()  # the first replay uploads the graph
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[repeats // 2]


_L2_BYTES = 50 << 20  # the H200's L2 (the H100's is the same)
