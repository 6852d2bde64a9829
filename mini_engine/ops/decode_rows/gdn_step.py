"""A Gated DeltaNet layer's decode step between its two projections, in one launch (``gdn_step``).

The split chain is three launches: ``conv_gdn_rows`` (the conv on the slots' conv rows, in place, and the prepared
row q|k|v|g|beta, which also joins the slot's pending rows), ``pending_replay_decode_triton`` (the slot's pending
rows and the new one replayed from its boundary state, or the new one alone after the running copy) and
``gated_rms_norm`` (the output norm, laid out for the output projection with zero padding rows).

``gdn_step`` is one program per (row, key head). The program owns the conv channels of its key head's q and k
and of the value heads that read that key head, so no other program reads a conv state it overwrites. It writes
the prepared row (a scratch row, and the slot's pending row), and then, per value head, replays with a whole
[K, V] state tile and norms the head's output where it holds it::

    program (row r, key head j):   conv q_j, k_j, v_h (h of j) -> prepared row -> per h: replay -> norm -> out[r]
                                   and out[r + batch], out[r + 2 batch], ... (rows past the batch) = 0

The helpers are the chain's (the conv's taps, the row's norms and gates, the replay's loop body, the norm), so
in the interpreter the bits are the chain's. On a GPU a whole-head tile reduces over other trees than the
chain's 32-column tiles, so there the two agree to rounding: each is batch-invariant and deterministic, and a
decode step uses one of them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_engine.ops import pdl
from mini_engine.ops.decode_rows.gdn_prepare import (
    _SOFTPLUS_THRESHOLD,
    _conv_window,
    _gdn_rows_setup,
    _key_head_row,
    _row_targets,
    _value_head_row,
    check_decode_conv,
)
from mini_engine.ops.decode_rows.triton import _gated_norm, _rows_of
from mini_engine.ops.gated_delta_rule.launch import check_running
from mini_engine.ops.gated_delta_rule.triton_decode import (
    _follows_run,
    _mark_run,
    _replay_head,
    check_replay,
)

__all__ = ["gdn_step"]


@triton.jit
def _conv_heads(x_row, w, w_stride, state_row, state_stride, channels, CONV_W: tl.constexpr, BLOCK_W: tl.constexpr):
    """The conv of ``channels`` (``conv_gdn_rows``' arithmetic), the slot's conv state of them advanced in place;
    returns the outputs."""
    out, state = _conv_window(x_row, w, w_stride, state_row, state_stride, channels, CONV_W, BLOCK_W)
    tl.debug_barrier()  # the whole old window is read before any of it is overwritten
    cols = tl.arange(0, BLOCK_W)[None, :]
    tl.store(state_row + channels[:, None] * state_stride + cols, state.to(state_row.dtype.element_ty),
             mask=cols < CONV_W - 1)
    return out


# One compile for every batch size and layer: an index row lies at an offset of the batch, a layer's run rows
# at an offset of the layer.
@triton.jit(do_not_specialize=["batch", "out_rows"], do_not_specialize_on_alignment=["pending_slots", "run_rows"])
def _gdn_step_kernel(x, x_stride, w, w_stride, conv_pool, conv_slot_stride, conv_state_stride, slots, a, b, ab_stride,
                     A_log, dt_bias, scratch, pending, pending_slot_stride, pending_slots, pending_rows, rec,
                     rec_slot_stride, run, run_rows, run_rows_stride, rows, z, z_stride, norm_weight, eps, out,
                     out_stride, batch, out_rows, scale, HV, KEY_DIM, VALUE_DIM, WIDTH, threshold,
                     CONV_W: tl.constexpr, BLOCK_W: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                     RATIO: tl.constexpr, HAS_RUN: tl.constexpr, PDL: tl.constexpr = False):
    pdl.begin(PDL)
    r, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    vv = tl.arange(0, DV)
    x_row = x + r * x_stride
    slot = tl.load(slots + r).to(tl.int64)
    conv_row = conv_pool + slot * conv_slot_stride
    dst, kept = _row_targets(scratch, pending, pending_slot_stride, pending_slots, pending_rows, r, WIDTH, True)
    cq = j * DK + tl.arange(0, DK)
    q = _conv_heads(x_row, w, w_stride, conv_row, conv_state_stride, cq, CONV_W, BLOCK_W)
    k = _conv_heads(x_row, w, w_stride, conv_row, conv_state_stride, KEY_DIM + cq, CONV_W, BLOCK_W)
    _key_head_row(q, k, j, dst, kept, KEY_DIM, DK, True)
    for i in tl.static_range(RATIO):
        h = j * RATIO + i
        v = _conv_heads(x_row, w, w_stride, conv_row, conv_state_stride, 2 * KEY_DIM + h * DV + vv, CONV_W,
                        BLOCK_W)
        _value_head_row(v, h, r, a, b, ab_stride, A_log, dt_bias, dst, kept, KEY_DIM, VALUE_DIM, HV, threshold,
                        DV, True)
    tl.debug_barrier()  # the prepared row is in memory before the replay reads it back
    n_pending = tl.load(rows + r)
    running = _follows_run(run_rows, run_rows_stride, slot, n_pending, HAS_RUN)
    for i in tl.static_range(RATIO):
        h = j * RATIO + i
        o = _replay_head(dst, pending + slot * pending_slot_stride, rec, run, slot * rec_slot_stride, n_pending,
                         running, h, j, vv, KEY_DIM, VALUE_DIM, HV, WIDTH, scale, DK, DV, HAS_RUN)
        gate = tl.load(z + r * z_stride + h * DV + vv).to(tl.float32)
        value = _gated_norm(o, gate, tl.load(norm_weight + vv).to(tl.float32), eps, DV)
        tl.store(out + r * out_stride + h * DV + vv, value.to(out.dtype.element_ty))
    _mark_run(run_rows, run_rows_stride, slot, n_pending, HAS_RUN)
    # the padding rows of the output projection's input, zeroed by the live rows' programs (rows r + batch,
    # r + 2 batch, ...): a program per padding row would hold this kernel's registers to store zeros
    for pad in range(r + batch, out_rows, batch):
        for i in tl.static_range(RATIO):
            tl.store(out + pad * out_stride + (j * RATIO + i) * DV + vv, tl.zeros([DV], out.dtype.element_ty))


def gdn_step(*, x: torch.Tensor, conv_weight: torch.Tensor, conv_pool: torch.Tensor, slots: torch.Tensor,
             a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, heads: tuple[int, int],
             head_dims: tuple[int, int], pending_pool: torch.Tensor, pending_slots: torch.Tensor,
             pending_rows: torch.Tensor, rec_pool: torch.Tensor, rows: torch.Tensor, z: torch.Tensor,
             norm_weight: torch.Tensor, eps: float, out_rows: int, out_dtype: torch.dtype,
             run_pool: torch.Tensor | None = None, run_rows: torch.Tensor | None = None,
             out: torch.Tensor | None = None, num_warps: int = 8) -> torch.Tensor:
    """The chain ``conv_gdn_rows`` (x, conv_weight, conv_pool, slots, a, b, A_log, dt_bias, the pending row's
    destination) -> ``pending_replay_decode_triton`` (rec_pool, rows, the running copy) -> ``gated_rms_norm`` (z,
    norm_weight, eps, out_rows, out_dtype) in one launch, with each step's arguments and contract: the slots'
    conv states, pending rows, boundary states and running copies advance as the chain advances them. Returns the
    normed output [out_rows, Hv * V] in ``out_dtype``, rows past the batch zero (in ``out`` if given: every element
    of it is written)."""
    (hk, hv), (dk, dv) = heads, head_dims
    if hk < 1 or hv % hk:
        raise ValueError(f"heads (Hk, Hv) = {heads}: Hv must be a multiple of Hk (a key head serves Hv / Hk value "
                         "heads)")
    batch = x.shape[0]
    window = check_decode_conv(x, conv_weight, conv_pool, slots, 2 * hk * dk + hv * dv)
    scratch, pending, _ = _gdn_rows_setup(x, a, b, batch, heads, head_dims, pending_pool, pending_slots, pending_rows)
    if check_replay(pending_pool, rec_pool, slots, rows, heads, batch, scratch.shape[1], scratch.dtype) != (dk, dv):
        raise ValueError(f"rec_pool's heads {tuple(rec_pool.shape[2:])} are not head_dims {head_dims}")
    has_run = check_running(rec_pool, run_pool, run_rows)
    _rows_of(z, "z", hv * dv)
    if out_rows < batch or z.shape[0] < batch:
        raise ValueError(f"out_rows ({out_rows}) and z's rows ({z.shape[0]}) must cover the batch of {batch}")
    if out is None:
        out = z.new_empty(out_rows, hv * dv, dtype=out_dtype)
    elif tuple(out.shape) != (out_rows, hv * dv) or out.dtype != out_dtype or out.stride(1) != 1:
        raise ValueError(f"out must be {out_dtype} [{out_rows}, {hv * dv}] with contiguous columns; got {out.dtype} "
                         f"{tuple(out.shape)}, strides {out.stride()}")
    if not batch:
        return out.zero_()
    _gdn_step_kernel[(batch, hk)](
        x, x.stride(0), conv_weight, conv_weight.stride(0), conv_pool, conv_pool.stride(0), conv_pool.stride(1),
        slots, a, b, a.stride(0), A_log, dt_bias, scratch, *pending, rec_pool, rec_pool.stride(0),
        run_pool if has_run else rec_pool, run_rows if has_run else rows, run_rows.stride(0) if has_run else 0,
        rows, z, z.stride(0), norm_weight, eps, out, out.stride(0), batch, out_rows, dk**-0.5, hv, hk * dk,
        hv * dv, scratch.shape[1], _SOFTPLUS_THRESHOLD, CONV_W=window, BLOCK_W=triton.next_power_of_2(window - 1),
        DK=dk, DV=dv, RATIO=hv // hk, HAS_RUN=has_run, num_warps=num_warps, **pdl.options())
    return out
