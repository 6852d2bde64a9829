"""Triton kernels of the depthwise causal conv1d, held to ``reference.py`` (the specification).

Two entry points, called by keyword, each taking the conv state either as a plain tensor (like the
reference) or from a slot pool, in place:

- ``causal_conv1d``: prefill of a packed variable-length batch. With ``conv_pool`` and
  ``slot_indices`` each sequence reads its state from ``conv_pool[slot_indices[b]]`` and its final
  state is written back there.
- ``causal_conv1d_update``: one decode step per sequence, same two ways.

A sequence's *window* is its conv state (``W - 1`` columns, oldest first) followed by its inputs::

    window position   0 .. W-2         | W-1        W       ...  W-2+len
    holds             state[c, 0..W-2] | x[start]   x[start+1] ... x[start+len-1]

Output ``t`` (0-based in the sequence) is ``sum_i weight[c, i] * window[t + i]`` taken tap by tap in
the reference's order, and the final state is ``window[len .. len + W - 2]``. Prefill and update
share that arithmetic, so a token's output is the same through either kernel.

In-place ordering: prefill reads states in one launch and writes final states in a second one
(stream order is the barrier between them); the update and the final-state kernels read a slot's
whole window before a CTA barrier and write after it. Two sequences must not name the same slot,
except the padding sink, whose content is garbage by contract.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_engine.device import row_indices, upload
from mini_engine.ops.causal_conv1d.reference import ConvResult

__all__ = ["causal_conv1d", "causal_conv1d_update"]

BLOCK_T = 64
MAX_BLOCK_C = 128
# The prefill tile: BLOCK_T x 64 channels over 8 warps. At 128 channels over 4 warps ptxas spills 1.6 KB a thread
# (255 registers); this asks 181 and spills nothing (``tests/unit/kernel_launches.py compile``, sm_90). A
# tile's shape never changes a value: every output is its own taps summed in order.
PREFILL_BLOCK_C, PREFILL_WARPS = 64, 8


@triton.jit
def _window(x_ptr, stride_xt, stride_xc, start, pos, state_row, stride_sc, stride_si, c, mask,
            WIDTH: tl.constexpr, HAS_STATE: tl.constexpr):
    """Window element(s) at ``pos`` of channel(s) ``c`` (see the module docstring), in float32.

    ``start`` is the sequence's first row of x; ``state_row`` points at its state slot. All
    arguments broadcast against each other.
    """
    from_x = pos >= WIDTH - 1
    row = (start + pos - (WIDTH - 1)).to(tl.int64)
    value = tl.load(x_ptr + row * stride_xt + c * stride_xc, mask=mask & from_x, other=0.0).to(tl.float32)
    if HAS_STATE:
        old = tl.load(state_row + c * stride_sc + pos * stride_si, mask=mask & (pos < WIDTH - 1), other=0.0)
        value = tl.where(from_x, value, old.to(tl.float32))
    return value


@triton.jit
def _tap(i, x_ptr, stride_xt, stride_xc, start, first, state_row, stride_sc, stride_si, c, c_ok, mask,
         w_ptr, stride_wc, stride_wi, WIDTH: tl.constexpr, HAS_STATE: tl.constexpr):
    """Tap ``i`` of the outputs whose windows begin at position ``first``: ``window[first + i] * weight[c, i]``."""
    weight = tl.load(w_ptr + c * stride_wc + i * stride_wi, mask=c_ok, other=0.0).to(tl.float32)
    return _window(x_ptr, stride_xt, stride_xc, start, first + i, state_row, stride_sc, stride_si, c,
                   mask, WIDTH, HAS_STATE) * weight


@triton.jit
def _activate(acc, SILU: tl.constexpr):
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    return acc


@triton.jit
def _sequence_of(t, cu_ptr, n_seq, steps):
    """Index of the sequence holding packed row ``t``: the largest ``s < n_seq`` with ``cu[s] <= t``."""
    lo = tl.zeros_like(t)
    hi = lo + n_seq  # invariant: cu[lo] <= t < cu[hi]
    for _ in range(steps):
        mid = (lo + hi) // 2
        right = tl.load(cu_ptr + mid) <= t
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    return lo


@triton.jit(do_not_specialize=["n_tokens", "n_seq", "steps"])  # per batch: one compile for all
def _prefill_kernel(x_ptr, w_ptr, out_ptr, state_ptr, slot_ptr, cu_ptr, n_tokens, n_channels, n_seq, steps,
                    stride_xt, stride_xc, stride_wc, stride_wi, stride_ot, stride_oc,
                    stride_ss, stride_sc, stride_si,
                    WIDTH: tl.constexpr, HAS_STATE: tl.constexpr, SILU: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """Outputs of BLOCK_T packed rows x BLOCK_C channels; a tile may span several sequences."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    t_ok, c_ok = t < n_tokens, c < n_channels
    seq = _sequence_of(t, cu_ptr, n_seq, steps)
    start = tl.load(cu_ptr + seq)
    state_row = state_ptr + tl.zeros([BLOCK_T], dtype=tl.int64)
    if HAS_STATE:
        state_row += tl.load(slot_ptr + seq).to(tl.int64) * stride_ss
    mask = t_ok[:, None] & c_ok[None, :]
    first = (t - start)[:, None]  # window position of each row's tap 0
    start, state_row, c, c_ok = start[:, None], state_row[:, None], c[None, :], c_ok[None, :]
    acc = _tap(0, x_ptr, stride_xt, stride_xc, start, first, state_row, stride_sc, stride_si, c, c_ok, mask,
               w_ptr, stride_wc, stride_wi, WIDTH, HAS_STATE)
    for i in tl.static_range(1, WIDTH):
        acc += _tap(i, x_ptr, stride_xt, stride_xc, start, first, state_row, stride_sc, stride_si, c, c_ok, mask,
                    w_ptr, stride_wc, stride_wi, WIDTH, HAS_STATE)
    out = _activate(acc, SILU)
    tl.store(out_ptr + t.to(tl.int64)[:, None] * stride_ot + c * stride_oc, out.to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _final_state_kernel(x_ptr, state_ptr, state_slot_ptr, final_ptr, final_slot_ptr, cu_ptr, n_channels,
                        stride_xt, stride_xc, stride_ss, stride_sc, stride_si, stride_fs, stride_fc, stride_fi,
                        WIDTH: tl.constexpr, HAS_STATE: tl.constexpr, BLOCK_C: tl.constexpr,
                        BLOCK_W: tl.constexpr):
    """``final[b] = window[len .. len + W - 2]`` of sequence b (may be the state it read: in place)."""
    b = tl.program_id(0)
    c = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C))[:, None]
    j = tl.arange(0, BLOCK_W)[None, :]
    start = tl.load(cu_ptr + b)
    length = tl.load(cu_ptr + b + 1) - start
    state_row = state_ptr
    if HAS_STATE:
        state_row = state_ptr + tl.load(state_slot_ptr + b).to(tl.int64) * stride_ss
    mask = (c < n_channels) & (j < WIDTH - 1)
    tail = _window(x_ptr, stride_xt, stride_xc, start, length + j, state_row, stride_sc, stride_si, c, mask,
                   WIDTH, HAS_STATE)
    tl.debug_barrier()  # the whole old window is read before any of it is overwritten
    final_row = final_ptr + tl.load(final_slot_ptr + b).to(tl.int64) * stride_fs
    tl.store(final_row + c * stride_fc + j * stride_fi, tail.to(final_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _update_kernel(x_ptr, w_ptr, out_ptr, state_ptr, state_slot_ptr, final_ptr, final_slot_ptr, n_channels,
                   stride_xb, stride_xc, stride_wc, stride_wi, stride_ob, stride_oc,
                   stride_ss, stride_sc, stride_si, stride_fs, stride_fc, stride_fi,
                   WIDTH: tl.constexpr, SILU: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr):
    """One step of sequence b: its window is state then the single input row ``x[b]``."""
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < n_channels
    state_row = state_ptr + tl.load(state_slot_ptr + b).to(tl.int64) * stride_ss
    first = tl.zeros([BLOCK_C], dtype=tl.int32)  # window position 0 of this sequence's single output
    acc = _tap(0, x_ptr, stride_xb, stride_xc, b, first, state_row, stride_sc, stride_si, c, c_ok, c_ok,
               w_ptr, stride_wc, stride_wi, WIDTH, True)
    for i in tl.static_range(1, WIDTH):
        acc += _tap(i, x_ptr, stride_xb, stride_xc, b, first, state_row, stride_sc, stride_si, c, c_ok, c_ok,
                    w_ptr, stride_wc, stride_wi, WIDTH, True)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + c * stride_oc, _activate(acc, SILU).to(out_ptr.dtype.element_ty),
             mask=c_ok)
    j = tl.arange(0, BLOCK_W)[None, :]
    mask = c_ok[:, None] & (j < WIDTH - 1)
    tail = _window(x_ptr, stride_xb, stride_xc, b, 1 + j, state_row, stride_sc, stride_si, c[:, None], mask,
                   WIDTH, True)
    tl.debug_barrier()  # the whole old window is read before any of it is overwritten
    final_row = final_ptr + tl.load(final_slot_ptr + b).to(tl.int64) * stride_fs
    tl.store(final_row + c[:, None] * stride_fc + j * stride_fi, tail.to(final_ptr.dtype.element_ty), mask=mask)


def _silu_flag(activation: str | None) -> bool:
    if activation not in ("silu", None):
        raise ValueError(f"activation must be 'silu' or None; got {activation!r}")
    return activation == "silu"


def _state_source(*, batch: int, channels: int, width: int, device: torch.device,
                  initial_state: torch.Tensor | None, conv_pool: torch.Tensor | None,
                  slot_indices: torch.Tensor | None) -> tuple:
    """Where states are read and final states written: ``(source or None, its slot ids, final, its slot ids,
    in_place)``. The plain form reads row b of ``initial_state`` and writes row b of a new float32 tensor."""
    if conv_pool is not None:
        if initial_state is not None or slot_indices is None:
            raise ValueError("pass either initial_state, or conv_pool together with slot_indices; not both")
        if conv_pool.dim() != 3 or tuple(conv_pool.shape[1:]) != (channels, width - 1):
            raise ValueError(f"conv_pool must be [n_slots, {channels}, {width - 1}]; got {tuple(conv_pool.shape)}")
        if slot_indices.shape != (batch,) or slot_indices.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"slot_indices must be an int32/int64 tensor of shape ({batch},); got "
                             f"{slot_indices.dtype} {tuple(slot_indices.shape)}")
        slots = upload(slot_indices, device)
        return conv_pool, slots, conv_pool, slots, True
    if slot_indices is not None:
        raise ValueError("slot_indices needs conv_pool (the pool they index)")
    state_shape = (batch, channels, width - 1)
    if initial_state is not None and tuple(initial_state.shape) != state_shape:
        raise ValueError(f"initial_state must be {state_shape}; got {tuple(initial_state.shape)}")
    rows = row_indices(batch, torch.device(device))
    final = torch.empty(state_shape, dtype=torch.float32, device=device)
    return initial_state, rows, final, rows, False


def causal_conv1d(
    *, x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None, conv_pool: torch.Tensor | None = None,
    slot_indices: torch.Tensor | None = None, activation: str | None = "silu",
) -> ConvResult:
    """Prefill over a packed batch; as the reference, plus the slot-pool form.

    x: [T, C]; weight: [C, W]; cu_seqlens: [B + 1]. States come from ``initial_state`` [B, C, W-1]
    (None: zeros), or from ``conv_pool[slot_indices]`` ([n_slots, C, W-1], any strides).
    Returns the output [T, C] in x's dtype and the final states: a new float32 [B, C, W-1] tensor,
    or None in the pool form, where they were written into ``conv_pool[slot_indices]`` (mutates).
    """
    channels, width = weight.shape
    if x.dim() != 2 or x.shape[1] != channels:
        raise ValueError(f"x must be [T, {channels}]; got {tuple(x.shape)}")
    n_seq = cu_seqlens.numel() - 1
    source, source_slots, final, final_slots, in_place = _state_source(
        batch=n_seq, channels=channels, width=width, device=x.device, initial_state=initial_state,
        conv_pool=conv_pool, slot_indices=slot_indices)
    silu = _silu_flag(activation)
    cu = upload(cu_seqlens, x.device)
    out = _new_output(x)
    n_tokens = x.shape[0]
    block_c = min(MAX_BLOCK_C, triton.next_power_of_2(channels))
    has_state = source is not None
    state = source if has_state else final  # an unread placeholder pointer when there is no state
    if n_tokens:
        tile_c = min(PREFILL_BLOCK_C, block_c)
        _prefill_kernel[(triton.cdiv(n_tokens, BLOCK_T), triton.cdiv(channels, tile_c))](
            x, weight, out, state, source_slots, cu, n_tokens, channels, n_seq, max(1, n_seq.bit_length()),
            *x.stride(), *weight.stride(), *out.stride(), *state.stride(),
            WIDTH=width, HAS_STATE=has_state, SILU=silu, BLOCK_T=BLOCK_T, BLOCK_C=tile_c, num_warps=PREFILL_WARPS)
    if n_seq:
        _final_state_kernel[(n_seq, triton.cdiv(channels, block_c))](
            x, state, source_slots, final, final_slots, cu, channels,
            *x.stride(), *state.stride(), *final.stride(),
            WIDTH=width, HAS_STATE=has_state, BLOCK_C=block_c, BLOCK_W=triton.next_power_of_2(width - 1))
    return ConvResult(out, None if in_place else final)


def causal_conv1d_update(
    *, x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None = None,
    conv_pool: torch.Tensor | None = None, slot_indices: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> ConvResult:
    """One decode step for B sequences; as the reference, plus the slot-pool form.

    x: [B, C]. The state is ``state`` [B, C, W-1] (left unchanged; the new state is returned as
    float32), or ``conv_pool[slot_indices]``, updated in place (final_state is then None).
    """
    channels, width = weight.shape
    if x.dim() != 2 or x.shape[1] != channels:
        raise ValueError(f"x must be [B, {channels}]; got {tuple(x.shape)}")
    if state is None and conv_pool is None:
        raise ValueError("causal_conv1d_update needs a state: pass state, or conv_pool with slot_indices")
    batch = x.shape[0]
    source, source_slots, final, final_slots, in_place = _state_source(
        batch=batch, channels=channels, width=width, device=x.device, initial_state=state,
        conv_pool=conv_pool, slot_indices=slot_indices)
    silu = _silu_flag(activation)
    out = _new_output(x)
    block_c = min(MAX_BLOCK_C, triton.next_power_of_2(channels))
    if batch:
        _update_kernel[(batch, triton.cdiv(channels, block_c))](
            x, weight, out, source, source_slots, final, final_slots, channels,
            *x.stride(), *weight.stride(), *out.stride(), *source.stride(), *final.stride(),
            WIDTH=width, SILU=silu, BLOCK_C=block_c, BLOCK_W=triton.next_power_of_2(width - 1))
    return ConvResult(out, None if in_place else final)


def _new_output(x: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor shaped like ``x``. Not ``empty_like``: of a one-row view (a pack of one decode row, sliced
    out of a fused projection) it keeps the view's row stride, and a stride is part of a Triton kernel's compile
    key (divisible by 16 or not), so a pack of one row would run other compiled kernels than any other pack."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
