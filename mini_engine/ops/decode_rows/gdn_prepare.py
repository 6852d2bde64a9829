"""Triton kernels for a Gated DeltaNet layer's prepared rows in the decode step, held to ``reference.gdn_rows``.

A prepared row is what the delta rule reads of one token: q and k L2-normalised per key head, v, and the gates
g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b) per value head (float32). ``gdn_rows`` prepares them
from the conv's outputs; ``conv_gdn_rows`` runs the decode conv on the slots' conv rows (in place) and prepares the
rows in the same launch. Either may also store each row among its slot's pending rows. ``gdn_step`` (the one-launch
GDN layer) reuses the helpers here, so its rows have the same arithmetic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_engine.ops import pdl
from mini_engine.ops.causal_conv1d.triton import _activate, _tap, _window
from mini_engine.ops.decode_rows.triton import _rows_of, _sigmoid

__all__ = ["check_decode_conv", "conv_gdn_rows", "gdn_rows"]

_SOFTPLUS_THRESHOLD = 20.0  # as torch and ``inv.softplus``


@triton.jit
def _l2_normalize(value):
    return value * tl.rsqrt(tl.sum(value * value, axis=0) + 1e-6)


@triton.jit
def _softplus(x, threshold):
    """log(1 + exp(x)), accurate for small exp(x) too (log(u) * e / (u - 1), u = 1 + e: Goldberg's log1p)."""
    e = tl.exp(tl.minimum(x, threshold))
    u = 1.0 + e
    exact = u == 1.0
    small = tl.where(exact, e, tl.log(u) * e / tl.where(exact, 1.0, u - 1.0))
    return tl.where(x > threshold, x, small)


@triton.jit
def _key_head_row(q, k, j, dst, kept, KEY_DIM, DK: tl.constexpr, HAS_PENDING: tl.constexpr):
    """Key head j's part of a prepared row: q and k (its conv outputs, float32 [DK]) L2-normalised."""
    kk = tl.arange(0, DK)
    q = _l2_normalize(q)
    k = _l2_normalize(k)
    tl.store(dst + j * DK + kk, q)
    tl.store(dst + KEY_DIM + j * DK + kk, k)
    if HAS_PENDING:
        tl.store(kept + j * DK + kk, q)
        tl.store(kept + KEY_DIM + j * DK + kk, k)


@triton.jit
def _value_head_row(v, h, r, a, b, ab_stride, A_log, dt_bias, dst, kept, KEY_DIM, VALUE_DIM, HV, threshold,
                    DV: tl.constexpr, HAS_PENDING: tl.constexpr):
    """Value head h's part of row r: v (its conv outputs, float32 [DV]) as is, g and beta from its gate inputs."""
    vv = tl.arange(0, DV)
    x = tl.load(a + r * ab_stride + h).to(tl.float32) + tl.load(dt_bias + h).to(tl.float32)
    g = -tl.exp(tl.load(A_log + h).to(tl.float32)) * _softplus(x, threshold)
    beta = _sigmoid(tl.load(b + r * ab_stride + h).to(tl.float32))
    gates = 2 * KEY_DIM + VALUE_DIM
    tl.store(dst + 2 * KEY_DIM + h * DV + vv, v)
    tl.store(dst + gates + h, g)
    tl.store(dst + gates + HV + h, beta)
    if HAS_PENDING:
        tl.store(kept + 2 * KEY_DIM + h * DV + vv, v)
        tl.store(kept + gates + h, g)
        tl.store(kept + gates + HV + h, beta)


@triton.jit
def _row_targets(out, pending, pending_slot_stride, pending_slots, pending_rows, r, WIDTH,
                 HAS_PENDING: tl.constexpr):
    """Where row r goes: its row of ``out``, and its pending row (``out``'s again when there is none)."""
    dst = out + r * WIDTH
    kept = dst
    if HAS_PENDING:  # the same row also joins its slot's pending rows
        slot = tl.load(pending_slots + r).to(tl.int64)
        kept = pending + slot * pending_slot_stride + tl.load(pending_rows + r).to(tl.int64) * WIDTH
    return dst, kept


@triton.jit
def _gdn_rows_kernel(conv, conv_stride, a, b, ab_stride, A_log, dt_bias, out, pending, pending_slot_stride,
                     pending_slots, pending_rows, HK, HV, KEY_DIM, VALUE_DIM, WIDTH, threshold,
                     DK: tl.constexpr, DV: tl.constexpr, HAS_PENDING: tl.constexpr):
    """Program (row, j): j < HK normalises key head j's q and k; j >= HK copies value head j - HK and its gates."""
    r, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    src = conv + r * conv_stride
    dst, kept = _row_targets(out, pending, pending_slot_stride, pending_slots, pending_rows, r, WIDTH, HAS_PENDING)
    if j < HK:
        kk = tl.arange(0, DK)
        q = tl.load(src + j * DK + kk).to(tl.float32)
        k = tl.load(src + KEY_DIM + j * DK + kk).to(tl.float32)
        _key_head_row(q, k, j, dst, kept, KEY_DIM, DK, HAS_PENDING)
    else:
        h = j - HK
        v = tl.load(src + 2 * KEY_DIM + h * DV + tl.arange(0, DV)).to(tl.float32)
        _value_head_row(v, h, r, a, b, ab_stride, A_log, dt_bias, dst, kept, KEY_DIM, VALUE_DIM, HV, threshold,
                        DV, HAS_PENDING)


@triton.jit
def _conv_window(x_row, w, w_stride, state_row, state_stride, c, WIDTH: tl.constexpr, BLOCK_W: tl.constexpr):
    """The decode conv of channels ``c`` through ``causal_conv1d``'s own tap and window helpers (its update kernel's
    arithmetic): returns (the SiLU output rounded to x's dtype, in float32; the new state, the window's last W - 1
    columns [C, BLOCK_W])."""
    every = c >= 0
    first = tl.zeros_like(c)  # window position of the single output's tap 0
    acc = _tap(0, x_row, 0, 1, 0, first, state_row, state_stride, 1, c, every, every, w, w_stride, 1, WIDTH, True)
    for i in tl.static_range(1, WIDTH):
        acc += _tap(i, x_row, 0, 1, 0, first, state_row, state_stride, 1, c, every, every, w, w_stride, 1, WIDTH, True)
    out = _activate(acc, True).to(x_row.dtype.element_ty).to(tl.float32)
    j = tl.arange(0, BLOCK_W)[None, :]
    tail = _window(x_row, 0, 1, 0, 1 + j, state_row, state_stride, 1, c[:, None], j < WIDTH - 1, WIDTH, True)
    return out, tail


@triton.jit(do_not_specialize_on_alignment=["pending_slots"])  # an index row at an offset of the batch
def _conv_gdn_rows_kernel(x, x_stride, w, w_stride, pool, slot_stride, state_stride, slots, a, b, ab_stride, A_log,
                          dt_bias, out, pending, pending_slot_stride, pending_slots, pending_rows, HK, HV, KEY_DIM,
                          VALUE_DIM, WIDTH, threshold, CONV_W: tl.constexpr, BLOCK_W: tl.constexpr, DK: tl.constexpr,
                          DV: tl.constexpr, HAS_PENDING: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, j): the conv of key head j's q and k channels (j < HK) or of value head j - HK's channels, its
    slot's conv state advanced in place, and that head's part of the prepared row (``_gdn_rows_kernel``'s)."""
    pdl.begin(PDL)
    r, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    x_row = x + r * x_stride
    state_row = pool + tl.load(slots + r).to(tl.int64) * slot_stride
    dst, kept = _row_targets(out, pending, pending_slot_stride, pending_slots, pending_rows, r, WIDTH, HAS_PENDING)
    cols = tl.arange(0, BLOCK_W)[None, :]
    keep = cols < CONV_W - 1
    state_type = pool.dtype.element_ty
    if j < HK:
        cq = j * DK + tl.arange(0, DK)
        ck = KEY_DIM + cq
        q, q_state = _conv_window(x_row, w, w_stride, state_row, state_stride, cq, CONV_W, BLOCK_W)
        k, k_state = _conv_window(x_row, w, w_stride, state_row, state_stride, ck, CONV_W, BLOCK_W)
        tl.debug_barrier()  # the whole old window is read before any of it is overwritten
        tl.store(state_row + cq[:, None] * state_stride + cols, q_state.to(state_type), mask=keep)
        tl.store(state_row + ck[:, None] * state_stride + cols, k_state.to(state_type), mask=keep)
        _key_head_row(q, k, j, dst, kept, KEY_DIM, DK, HAS_PENDING)
    else:
        h = j - HK
        cv = 2 * KEY_DIM + h * DV + tl.arange(0, DV)
        v, v_state = _conv_window(x_row, w, w_stride, state_row, state_stride, cv, CONV_W, BLOCK_W)
        tl.debug_barrier()
        tl.store(state_row + cv[:, None] * state_stride + cols, v_state.to(state_type), mask=keep)
        _value_head_row(v, h, r, a, b, ab_stride, A_log, dt_bias, dst, kept, KEY_DIM, VALUE_DIM, HV, threshold,
                        DV, HAS_PENDING)


def _gdn_rows_setup(conv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, batch: int, heads: tuple[int, int],
                    head_dims: tuple[int, int], pending_pool, pending_slots, pending_rows) -> tuple:
    """The rows' output, the pending arguments a kernel takes, and whether there are pending rows to store."""
    (hk, hv), (dk, dv) = heads, head_dims
    width = 2 * hk * dk + hv * dv + 2 * hv
    if a.stride() != b.stride() or a.shape[0] < batch or b.shape[0] < batch:
        raise ValueError("a and b must be [>= B, Hv] slices of one fused output (the same strides)")
    out = conv.new_empty(batch, width, dtype=torch.float32)
    if pending_pool is None:
        return out, (out, 0, out, out), False
    if pending_pool.shape[2] != width or pending_pool.stride()[1:] != (width, 1):
        raise ValueError(f"pending_pool must be [slots, 63, {width}] with contiguous rows; got "
                         f"{tuple(pending_pool.shape)}, strides {pending_pool.stride()}")
    return out, (pending_pool, pending_pool.stride(0), pending_slots, pending_rows), True


def gdn_rows(*, conv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
             heads: tuple[int, int], head_dims: tuple[int, int], pending_pool: torch.Tensor | None = None,
             pending_slots: torch.Tensor | None = None, pending_rows: torch.Tensor | None = None) -> torch.Tensor:
    """As the reference; with ``pending_pool`` [slots, 63, width] also stores row b at
    ``pending_pool[pending_slots[b], pending_rows[b]]``."""
    (hk, hv), (dk, dv) = heads, head_dims
    batch = conv.shape[0]
    key_dim, value_dim = hk * dk, hv * dv
    _rows_of(conv, "conv", 2 * key_dim + value_dim)
    out, pending, has_pending = _gdn_rows_setup(conv, a, b, batch, heads, head_dims, pending_pool, pending_slots,
                                          pending_rows)
    if batch:
        _gdn_rows_kernel[(batch, hk + hv)](
            conv, conv.stride(0), a, b, a.stride(0), A_log, dt_bias, out, *pending, hk, hv, key_dim, value_dim,
            out.shape[1], _SOFTPLUS_THRESHOLD, DK=dk, DV=dv, HAS_PENDING=has_pending)
    return out


def check_decode_conv(x: torch.Tensor, conv_weight: torch.Tensor, conv_pool: torch.Tensor, slots: torch.Tensor,
                      channels: int) -> int:
    """A decode step's conv inputs (``conv_gdn_rows``'), checked; returns the conv's width W."""
    _rows_of(x, "x", channels)
    window = conv_weight.shape[1]
    if conv_weight.shape[0] != channels or window < 2 or conv_weight.stride(1) != 1:
        raise ValueError(f"conv_weight must be [{channels}, W >= 2] with contiguous taps; got "
                         f"{tuple(conv_weight.shape)}, strides {conv_weight.stride()}")
    if conv_pool.dim() != 3 or tuple(conv_pool.shape[1:]) != (channels, window - 1) or conv_pool.stride(2) != 1:
        raise ValueError(f"conv_pool must be [slots, {channels}, {window - 1}] with contiguous columns; got "
                         f"{tuple(conv_pool.shape)}, strides {conv_pool.stride()}")
    if tuple(slots.shape) != (x.shape[0],):
        raise ValueError(f"slots must be [{x.shape[0]}]; got {tuple(slots.shape)}")
    return window


def conv_gdn_rows(*, x: torch.Tensor, conv_weight: torch.Tensor, conv_pool: torch.Tensor, slots: torch.Tensor,
                  a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, heads: tuple[int, int],
                  head_dims: tuple[int, int], pending_pool: torch.Tensor | None = None,
                  pending_slots: torch.Tensor | None = None, pending_rows: torch.Tensor | None = None) -> torch.Tensor:
    """The decode step's conv and prepared rows in one launch: ``causal_conv1d_update(x=x, weight=conv_weight,
    conv_pool=conv_pool, slot_indices=slots, activation="silu")`` (each slot's conv state advanced in place), then
    ``gdn_rows`` of its output (the same arithmetic and bits; the conv output never goes to memory).
    x [B, 2*Hk*K + Hv*V] (a column slice of the fused projection); conv_weight [C, W]; conv_pool [slots, C, W - 1]
    with unit column stride; ``slots`` [B] distinct."""
    (hk, hv), (dk, dv) = heads, head_dims
    key_dim, value_dim = hk * dk, hv * dv
    batch = x.shape[0]
    window = check_decode_conv(x, conv_weight, conv_pool, slots, 2 * key_dim + value_dim)
    out, pending, has_pending = _gdn_rows_setup(x, a, b, batch, heads, head_dims, pending_pool, pending_slots,
                                                pending_rows)
    if batch:
        _conv_gdn_rows_kernel[(batch, hk + hv)](
            x, x.stride(0), conv_weight, conv_weight.stride(0), conv_pool, conv_pool.stride(0), conv_pool.stride(1),
            slots, a, b, a.stride(0), A_log, dt_bias, out, *pending, hk, hv, key_dim, value_dim, out.shape[1],
            _SOFTPLUS_THRESHOLD, CONV_W=window, BLOCK_W=triton.next_power_of_2(window - 1), DK=dk, DV=dv,
            HAS_PENDING=has_pending, **pdl.options())
    return out
