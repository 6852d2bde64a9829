"""Triton decode kernels for the gated delta rule: one token per sequence, states in the slot pool in place.

- ``fused_recurrent_gated_delta_rule_triton``: one program per (V tile, sequence, value head) reads its
  [K, BV] tile of the float32 state once, applies decay, the delta-rule write and the read-out in
  registers, and writes it back.
- ``pending_replay_decode_triton``: the same on chunk-exact slots (``mini_engine.model.state``): the
  slot keeps the state at its last 64-boundary and the prepared rows since; the program replays those
  rows and the new one from the boundary state, and writes the state back only when the token
  completes the chunk; with a running copy of the state beside the slot, a step that follows a step
  starts from that copy instead (one row instead of up to 64, the same bits).

Held to ``reference.py`` like the prefill kernels in ``triton.py``; both take their launch configuration
and argument checks from ``launch.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_engine.device import upload
from mini_engine.ops import pdl
from mini_engine.ops.counters import counters
from mini_engine.ops.decode_rows.triton import _gated_norm
from mini_engine.ops.gated_delta_rule.launch import LaunchConfig, check_head_sizes, check_pool, check_running, v_tiles
from mini_engine.ops.gated_delta_rule.reference import CHUNK

__all__ = ["check_replay", "fused_recurrent_gated_delta_rule_triton", "pending_replay_decode_triton"]


@triton.jit
def _recurrent_step_kernel(q, k, v, g, beta, pool, pool_rows, slot_stride, out, scale, HK, HV,
                           K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    vt, b, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = h // (HV // HK)
    kk = tl.arange(0, K)
    cols = vt * BV + tl.arange(0, BV)
    slot = tl.load(pool_rows + b).to(tl.int64)
    tile = pool + slot * slot_stride + h * (K * V) + kk[:, None] * V + cols[None, :]
    state = tl.load(tile).to(tl.float32)
    k_t = tl.load(k + (b * HK + hk) * K + kk).to(tl.float32)
    q_t = tl.load(q + (b * HK + hk) * K + kk).to(tl.float32) * scale
    v_t = tl.load(v + (b * HV + h) * V + cols).to(tl.float32)
    state = state * tl.exp(tl.load(g + b * HV + h).to(tl.float32))
    delta = (v_t - tl.sum(state * k_t[:, None], axis=0)) * tl.load(beta + b * HV + h).to(tl.float32)
    state = state + k_t[:, None] * delta[None, :]
    tl.store(tile, state.to(pool.dtype.element_ty))
    tl.store(out + (b * HV + h) * V + cols, tl.sum(state * q_t[:, None], axis=0).to(out.dtype.element_ty))


@triton.jit
def _delta_step(state, row, hk, h, kk, cols, KEY_DIM, VALUE_DIM, HV, K: tl.constexpr, V: tl.constexpr):
    """One token of the recurrence on a [K, BV] state tile, the token a prepared row q|k|v|g|beta at ``row``."""
    k_t = tl.load(row + KEY_DIM + hk * K + kk).to(tl.float32)
    v_t = tl.load(row + 2 * KEY_DIM + h * V + cols).to(tl.float32)
    g_t = tl.load(row + 2 * KEY_DIM + VALUE_DIM + h).to(tl.float32)
    beta_t = tl.load(row + 2 * KEY_DIM + VALUE_DIM + HV + h).to(tl.float32)
    state = state * tl.exp(g_t)
    delta = (v_t - tl.sum(state * k_t[:, None], axis=0)) * beta_t
    return state + k_t[:, None] * delta[None, :]


@triton.jit
def _follows_run(run_rows, run_rows_stride, slot, n_pending, HAS_RUN: tl.constexpr):
    """Whether the slot's running copy holds the state after its ``n_pending`` rows (the last step left it there).

    The count is kept twice, by the parity of the rows it counts: a step reads the entry of its own count's parity
    and writes the other one, so no program of a step reads an entry a sibling program of the same step (another
    head or V tile of the slot) has already moved on."""
    if HAS_RUN:
        return tl.load(run_rows + slot * run_rows_stride + n_pending % 2) == n_pending
    return n_pending < 0  # (never)


@triton.jit
def _replay_head(new_row, pending_rows, rec, run, slot_offset, n_pending, running, h, hk, cols, KEY_DIM, VALUE_DIM,
                 HV, ROW_WIDTH, scale, K: tl.constexpr, V: tl.constexpr, HAS_RUN: tl.constexpr):
    """Value head h, state columns ``cols``: the slot's ``n_pending`` rows (at ``pending_rows``) and the new one
    replayed from the boundary state, or the new one alone after the running copy; the state written back where the
    slot keeps it (``rec`` when the token completes its chunk, else the running copy). Returns the output [cols]."""
    kk = tl.arange(0, K)
    offsets = h * (K * V) + kk[:, None] * V + cols[None, :]
    tile = rec + slot_offset + offsets
    if HAS_RUN:  # the state after the slot's pending rows, if the last step on this slot left it there
        run_tile = run + slot_offset + offsets
        first = tl.where(running, n_pending, 0)
        state = tl.load(tl.where(running, run_tile, tile)).to(tl.float32)
    else:
        first = n_pending * 0
        state = tl.load(tile).to(tl.float32)
    # one loop body for every row, the new one included: a state from the running copy and one replayed
    # from the boundary went through the same instructions, so they are the same bits
    for j in range(first, n_pending + 1):
        state = _delta_step(state, tl.where(j < n_pending, pending_rows + j * ROW_WIDTH, new_row), hk, h, kk, cols,
                            KEY_DIM, VALUE_DIM, HV, K, V)
    q_t = tl.load(new_row + hk * K + kk).to(tl.float32) * scale
    o = tl.sum(state * q_t[:, None], axis=0)
    if n_pending == 63:  # the token completes its chunk: the slot now keeps the state at the boundary
        tl.store(tile, state.to(rec.dtype.element_ty))
    elif HAS_RUN:
        tl.store(run_tile, state.to(run.dtype.element_ty))
    return o


@triton.jit
def _mark_run(run_rows, run_rows_stride, slot, n_pending, HAS_RUN: tl.constexpr):
    """The running copy's row count after the step: -1 when the chunk completed (the state went to ``rec``)."""
    if HAS_RUN:
        tl.store(run_rows + slot * run_rows_stride + (n_pending + 1) % 2, tl.where(n_pending == 63, -1, n_pending + 1))


# one compile for every batch; run_rows: one layer's rows, at an offset of the layer
@triton.jit(do_not_specialize=["n_seq", "out_rows"], do_not_specialize_on_alignment=["run_rows"])
def _pending_replay_kernel(new_rows, pending, pending_slot_stride, rec, rec_slot_stride, run, run_rows,
                           run_rows_stride, slots, rows, out, scale, HK, HV, KEY_DIM, VALUE_DIM, ROW_WIDTH, n_seq,
                           out_rows, z, z_stride, norm_weight, gated, gated_stride, eps, counters,
                           K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_RUN: tl.constexpr,
                           NORM: tl.constexpr = False, PDL: tl.constexpr = False):
    """Program (V tile, row, value head). NORM: each head's last program to store its tile applies the head's gated
    norm (``_norm_head``), and each program zeros its columns of the gated output's padding rows b + n_seq,
    b + 2 n_seq, ... below ``out_rows`` (no program of its own a padding row: the step's grid stays the batch's)."""
    pdl.begin(PDL)
    vt, b, h = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    cols = vt * BV + tl.arange(0, BV)
    slot = tl.load(slots + b).to(tl.int64)
    n_pending = tl.load(rows + b)
    running = _follows_run(run_rows, run_rows_stride, slot, n_pending, HAS_RUN)
    o = _replay_head(new_rows + b * ROW_WIDTH, pending + slot * pending_slot_stride, rec, run, slot * rec_slot_stride,
                     n_pending, running, h, h // (HV // HK), cols, KEY_DIM, VALUE_DIM, HV, ROW_WIDTH, scale, K, V,
                     HAS_RUN)
    tl.store(out + (b * HV + h) * V + cols, o.to(out.dtype.element_ty))
    _mark_run(run_rows, run_rows_stride, slot, n_pending, HAS_RUN)
    if NORM:
        for pad in range(b + n_seq, out_rows, n_seq):
            tl.store(gated + pad * gated_stride + h * V + cols, tl.zeros([BV], gated.dtype.element_ty))
        _norm_head(out + (b * HV + h) * V, z + b * z_stride + h * V, norm_weight, gated + b * gated_stride + h * V,
                   eps, counters + b * HV + h, V, V // BV)


@triton.jit
def _norm_head(core, z, weight, gated, eps, counter, V: tl.constexpr, TILES: tl.constexpr):
    """A value head's ``gated_rms_norm`` (its arithmetic, on the head's output as stored), made by whichever of the
    head's TILES programs counts in last on its counter (``ops.counters``), which it then sets back to zero."""
    if TILES > 1:
        tl.debug_barrier()  # every thread's part of the tile stored before the count that publishes it
        last = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == TILES - 1
    else:
        last = True
    if last:
        d = tl.arange(0, V)
        c = tl.load(core + d, cache_modifier=".cg").to(tl.float32)
        gate = tl.load(z + d).to(tl.float32)
        w = tl.load(weight + d).to(tl.float32)
        tl.store(gated + d, _gated_norm(c, gate, w, eps, V).to(gated.dtype.element_ty))
        if TILES > 1:
            tl.atomic_xchg(counter, 0)


def fused_recurrent_gated_delta_rule_triton(
    *, q, k, v, g, beta, state_pool, state_indices, scale: float | None = None, config: LaunchConfig | None = None,
) -> torch.Tensor:
    """One decode step: q, k [B, Hk, K], v [B, Hv, V], g, beta [B, Hv]; returns the output [B, Hv, V].

    Sequence ``b``'s state is row ``state_indices[b]`` of ``state_pool`` [slots, Hv, K, V]; it is
    read and overwritten in place. Rows must be distinct, except a padding sink whose contents
    nobody reads.
    """
    if q.dim() != 3 or q.shape != k.shape:
        raise ValueError(f"q and k must both be [B, Hk, K]; got {tuple(q.shape)} and {tuple(k.shape)}")
    n_seq, hk, k_dim = q.shape
    if v.dim() != 3 or v.shape[0] != n_seq or v.shape[1] % hk:
        raise ValueError(f"v must be [B, Hv, V] with B={n_seq} and Hv a multiple of Hk={hk}; got {tuple(v.shape)}")
    hv, v_dim = v.shape[1], v.shape[2]
    for name, t in (("g", g), ("beta", beta)):
        if tuple(t.shape) != (n_seq, hv):
            raise ValueError(f"{name} must be [B, Hv] = {(n_seq, hv)}; got {tuple(t.shape)}")
    check_head_sizes(k_dim, v_dim, q.dtype)
    check_pool(state_pool, state_indices, n_seq, (hv, k_dim, v_dim))
    scale = k_dim**-0.5 if scale is None else scale
    config = config or LaunchConfig(block_v=min(32, v_dim), num_stages=1)
    out = v.new_empty(n_seq, hv, v_dim)
    if n_seq:
        q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
        rows = upload(state_indices.to(torch.int32), q.device)
        _recurrent_step_kernel[(v_tiles(config, v_dim), n_seq, hv)](
            q, k, v, g, beta, state_pool, rows, state_pool.stride(0), out, scale, hk, hv, K=k_dim, V=v_dim,
            BV=config.block_v, num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def check_replay(pending_pool, rec_pool, slots, rows, heads: tuple[int, int], n_seq: int, width: int,
                 dtype: torch.dtype) -> tuple[int, int]:
    """The chunk-exact slots a decode step replays (``pending_replay_decode_triton``'s pools and indices), checked;
    returns the head sizes (K, V)."""
    hk, hv = heads
    if rec_pool.dim() != 4 or rec_pool.shape[1] != hv:
        raise ValueError(f"rec_pool must be [slots, Hv={hv}, K, V]; got {tuple(rec_pool.shape)}")
    k_dim, v_dim = rec_pool.shape[2], rec_pool.shape[3]
    if width != 2 * hk * k_dim + hv * v_dim + 2 * hv:
        raise ValueError(f"rows of width {width} do not hold q|k|v|g|beta for Hk={hk}, Hv={hv}, K={k_dim}, V={v_dim}")
    if pending_pool.dim() != 3 or pending_pool.shape[1] != CHUNK - 1 or pending_pool.shape[2] != width \
            or pending_pool.stride()[1:] != (width, 1):
        raise ValueError(f"pending_pool must be [slots, {CHUNK - 1}, {width}] with contiguous rows; got "
                         f"{tuple(pending_pool.shape)}, strides {pending_pool.stride()}")
    check_head_sizes(k_dim, v_dim, dtype)
    check_pool(rec_pool, slots, n_seq, (hv, k_dim, v_dim))
    if tuple(rows.shape) != (n_seq,):
        raise ValueError(f"rows must be [{n_seq}]; got {tuple(rows.shape)}")
    return k_dim, v_dim


def pending_replay_decode_triton(
    *, new_rows, pending_pool, rec_pool, slots, rows, heads: tuple[int, int], run_pool=None, run_rows=None,
    scale: float | None = None, config: LaunchConfig | None = None, z=None, norm_weight=None, eps: float | None = None,
    out_rows: int | None = None, out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """One decode step on chunk-exact slots (``mini_engine.model.state``): returns the output [B, Hv, V].

    ``new_rows`` [B, width]: each sequence's new token as a prepared row q|k|v|g|beta (q, k per key
    head of K; v per value head of V; g, beta per value head). Sequence b's slot ``slots[b]`` holds in
    ``rec_pool`` [slots, Hv, K, V] the state at its last 64-boundary and in ``pending_pool``
    [slots, 63, width] the ``rows[b]`` rows since. One program per (V tile, sequence, value head)
    replays those rows and the new one from the boundary state in registers (the recurrent rule, as
    ``fused_recurrent_gated_delta_rule_triton``), reads the new token's output, and, when the token
    completes the chunk (``rows[b] == 63``), writes the state at the new boundary into the slot's
    ``rec_pool`` row. The pending rows are only read: appending the new row is the caller's.
    ``heads`` = (Hk, Hv); K = V = the head sizes implied by ``width`` and the pools.

    With ``run_pool`` [slots, Hv, K, V] and ``run_rows`` [slots, 2] int32 (the running copy): a step that
    does not complete its chunk also leaves the state after its token in the slot's ``run_pool`` row
    and ``rows[b] + 1`` in ``run_rows[slot, (rows[b] + 1) % 2]``; a step whose ``run_rows[slot, rows[b] % 2]``
    equals its ``rows[b]`` starts from that state instead of replaying, any other value (-1: whoever last
    wrote the slot) replays. (Two entries, so that a step never reads the count its own programs write.) Both
    paths give the same bits, so a stale count costs a replay and never a wrong state; a slot written
    by anything else must have its ``run_rows`` set to -1 (``StateStorage`` does).

    With ``z`` [>= B, Hv * V] (any row stride), ``norm_weight`` [V], ``eps``, ``out_rows`` (>= B) and ``out_dtype``
    the same launch also applies the layer's output norm: returns ``gated_rms_norm(core=out, z=z, weight=norm_weight,
    eps=eps, rows=out_rows, out_dtype=out_dtype)``'s bits [out_rows, Hv * V], made per value head by the last of its
    V tiles' programs to finish (``ops.counters``), the rows past B zero (written by the batch's programs).
    """
    hk, hv = heads
    n_seq, width = new_rows.shape
    if not new_rows.is_contiguous():
        raise ValueError(f"new_rows must be contiguous; got strides {new_rows.stride()}")
    k_dim, v_dim = check_replay(pending_pool, rec_pool, slots, rows, heads, n_seq, width, new_rows.dtype)
    scale = k_dim**-0.5 if scale is None else scale
    config = config or LaunchConfig(block_v=min(32, v_dim), num_stages=1)
    has_run = check_running(rec_pool, run_pool, run_rows)
    normed = z is not None
    if normed and (out_rows is None or out_rows < n_seq or out_dtype is None or eps is None or z.dim() != 2
                   or z.shape[0] < out_rows or z.shape[1] != hv * v_dim or z.stride(1) != 1
                   or norm_weight is None or tuple(norm_weight.shape) != (v_dim,)):
        raise ValueError(f"the output norm needs z [>= out_rows, {hv * v_dim}] with contiguous columns, norm_weight "
                         f"[{v_dim}], eps, out_rows >= {n_seq} and out_dtype; got z {tuple(z.shape)} strides "
                         f"{z.stride()}, norm_weight {None if norm_weight is None else tuple(norm_weight.shape)}, "
                         f"eps={eps}, out_rows={out_rows}, out_dtype={out_dtype}")
    if not normed and any(a is not None for a in (norm_weight, eps, out_rows, out_dtype)):
        raise ValueError("norm_weight, eps, out_rows and out_dtype go with z (the output norm): pass them with it")
    out = new_rows.new_empty(n_seq, hv, v_dim)
    if normed:  # (no live row to write the padding rows' zeros: they are the whole output)
        gated = new_rows.new_empty(out_rows, hv * v_dim, dtype=out_dtype) if n_seq else \
            new_rows.new_zeros(out_rows, hv * v_dim, dtype=out_dtype)
        norm_args = (out_rows, z, z.stride(0), norm_weight, gated, gated.stride(0), eps,
                     counters(n_seq * hv, out.device))
    else:
        gated, norm_args = out, (n_seq, out, 0, out, out, 0, 0.0, out)  # (unread without the norm)
    if n_seq:
        _pending_replay_kernel[(v_tiles(config, v_dim), n_seq, hv)](
            new_rows, pending_pool, pending_pool.stride(0), rec_pool, rec_pool.stride(0),
            run_pool if has_run else rec_pool, run_rows if has_run else rows, run_rows.stride(0) if has_run else 0,
            slots, rows, out, scale,
            hk, hv, hk * k_dim, hv * v_dim, width, n_seq, *norm_args, K=k_dim, V=v_dim, BV=config.block_v,
            HAS_RUN=has_run, NORM=normed, num_warps=config.num_warps, num_stages=config.num_stages, **pdl.options())
    return gated
