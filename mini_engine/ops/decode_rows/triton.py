"""Triton kernels for the per-row pieces of a decode step, held to ``reference.py``.

Each replaces a chain of small torch ops (a norm is five, a RoPE fifteen) by one launch over the
batch's rows, so a CUDA-graphed decode step costs about a dozen launches per layer. Every kernel
reads a row's inputs and writes that row's outputs only, in float32: a sequence's result does not
depend on the rest of the batch. Rows past the batch in a padded output are written as zeros.

The step's gemm for 16-bit weights is ``gemm.py``; a Gated DeltaNet layer's prepared rows (its conv and gates)
are ``gdn_prepare.py``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mini_engine.ops import pdl

__all__ = ["Parts", "add_rms_norm", "gated_rms_norm", "qk_norm_rope", "sigmoid_mul", "silu_mul"]


class Parts(NamedTuple):
    """A split gemm's output before its K parts are added (``gemm.linear(unsummed=True)``): what reads it adds them."""

    sums: torch.Tensor  # [split, rows, cols] float32: part k's partial products
    dtype: torch.dtype  # the dtype their sum is rounded to (the gemm's output dtype)


_TRITON_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit(do_not_specialize=["live"])  # one compile for every batch size
def _add_rms_norm_kernel(x, delta, weight, out, n_cols, x_stride, delta_stride, part_stride, out_stride, eps, live,
                         HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, PARTS: tl.constexpr = 0,
                         PART_DTYPE: tl.constexpr = tl.float32, PDL: tl.constexpr = False):
    """Row ``row``; rows from ``live`` on are padding: their output is zeros, and nothing of theirs is read. With
    PARTS > 0 ``delta`` is a split gemm's float32 K parts (``part_stride`` apart), added here as the gemm's own sum
    adds them (``gemm._sum_parts_kernel``: in order 0, 1, ..., rounded to PART_DTYPE), so the same bits."""
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    if row >= live:
        tl.store(out + row * out_stride + cols, tl.zeros([BLOCK], out.dtype.element_ty), mask=ok)
        return
    value = tl.load(x + row * x_stride + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_DELTA:
        change = tl.load(delta + row * delta_stride + cols, mask=ok, other=0.0)
        if PARTS > 0:
            for part in tl.static_range(1, PARTS):
                change += tl.load(delta + part * part_stride + row * delta_stride + cols, mask=ok, other=0.0)
            change = change.to(PART_DTYPE)
        value += change.to(tl.float32)
        tl.store(x + row * x_stride + cols, value, mask=ok)
    normed = value * tl.rsqrt(tl.sum(value * value, axis=0) / n_cols + eps)
    scale = 1.0 + tl.load(weight + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + row * out_stride + cols, (normed * scale).to(out.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["batch"])  # one compile for every batch size
def _gated_rms_norm_kernel(core, z, z_stride, weight, out, out_stride, batch, HV, eps,
                           DV: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, value head); a padding row (past the batch) loads zeros and so stores zeros."""
    pdl.begin(PDL)
    r, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    ok = cols < DV
    live = ok & (r < batch)
    c = tl.load(core + (r * HV + h) * DV + cols, mask=live, other=0.0).to(tl.float32)
    gate = tl.load(z + r * z_stride + h * DV + cols, mask=live, other=0.0).to(tl.float32)
    w = tl.load(weight + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + r * out_stride + h * DV + cols, _gated_norm(c, gate, w, eps, DV).to(out.dtype.element_ty), mask=ok)


@triton.jit
def _gated_norm(c, gate, w, eps, DV: tl.constexpr):
    """A value head's ``w * rmsnorm(c) * silu(gate)`` over its DV channels (lanes past DV hold zeros)."""
    normed = c * tl.rsqrt(tl.sum(c * c, axis=0) / DV + eps)
    return w * normed * (gate * _sigmoid(gate))


@triton.jit
def _page_offsets(kv_rows, r, h, d, page_stride, HKV, D: tl.constexpr, PAGE: tl.constexpr):
    """Element offsets of kv head h, channels d, at row r's cache position ``kv_rows[r]`` (page * PAGE + offset) of a
    [pages, PAGE, HKV, D] cache contiguous below the page."""
    kv_row = tl.load(kv_rows + r).to(tl.int64)
    return (kv_row // PAGE) * page_stride + ((kv_row % PAGE) * HKV + h) * D + d


@triton.jit(do_not_specialize_on_alignment=["positions"])  # an index row at an offset of the batch
def _qk_norm_rope_kernel(qkv, qkv_stride, positions, q_weight, k_weight, inv_freq, q_out, k_out, v_out, HQ, HKV,
                         eps, k_cache, v_cache, kv_rows, page_stride, D: tl.constexpr, ROTARY: tl.constexpr,
                         BLOCK_D: tl.constexpr, PAGE: tl.constexpr, TO_PAGES: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, j): j < HQ is query head j, else kv head j - HQ (its key normed and rotated, its value copied;
    with TO_PAGES both also stored at the row's position ``kv_rows[r]`` of the paged caches, as ``write_kv_pages``)."""
    pdl.begin(PDL)
    r, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    row = qkv + r * qkv_stride
    if j < HQ:
        src, weight, dst = row + j * 2 * D, q_weight, q_out + (r * HQ + j) * D
    else:
        h = j - HQ
        src, weight, dst = row + HQ * 2 * D + h * D, k_weight, k_out + (r * HKV + h) * D
        value = tl.load(src + HKV * D + d, mask=ok).to(tl.float32)
        tl.store(v_out + (r * HKV + h) * D + d, value, mask=ok)
        if TO_PAGES:
            tl.store(v_cache + _page_offsets(kv_rows, r, h, d, page_stride, HKV, D, PAGE),
                     value.to(v_cache.dtype.element_ty), mask=ok)
    x = tl.load(src + d, mask=ok, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * inv_rms * (1.0 + tl.load(weight + d, mask=ok, other=0.0).to(tl.float32))
    half: tl.constexpr = ROTARY // 2
    rotated = d < ROTARY
    partner = tl.where(d < half, d + half, d - half)
    xp = tl.load(src + partner, mask=rotated, other=0.0).to(tl.float32)
    yp = xp * inv_rms * (1.0 + tl.load(weight + partner, mask=rotated, other=0.0).to(tl.float32))
    angle = tl.load(positions + r).to(tl.float32) * tl.load(inv_freq + d % half, mask=rotated, other=0.0)
    turned = y * tl.cos(angle) + tl.where(d < half, -yp, yp) * tl.sin(angle)
    result = tl.where(rotated, turned, y)
    tl.store(dst + d, result, mask=ok)
    if TO_PAGES:
        if j >= HQ:
            tl.store(k_cache + _page_offsets(kv_rows, r, j - HQ, d, page_stride, HKV, D, PAGE),
                     result.to(k_cache.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["batch"])  # one compile for every batch size
def _sigmoid_mul_kernel(attn, qkv, qkv_stride, out, out_stride, batch, HQ, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (row, query head); a padding row loads zeros and so stores zeros."""
    r, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    live = ok & (r < batch)
    a = tl.load(attn + (r * HQ + h) * D + d, mask=live, other=0.0).to(tl.float32)
    gate = tl.load(qkv + r * qkv_stride + h * 2 * D + D + d, mask=live, other=0.0).to(tl.float32)
    tl.store(out + r * out_stride + h * D + d, (a * _sigmoid(gate)).to(out.dtype.element_ty), mask=ok)


@triton.jit
def silu_times(gate, up):
    """SiLU(gate) * up in float32 (``silu_mul``'s arithmetic, which the gemm's epilogue shares: the same bits)."""
    return gate * _sigmoid(gate) * up


@triton.jit(do_not_specialize=["live"])  # one compile for every batch size
def _silu_mul_kernel(gate_up, in_stride, out, out_stride, n_cols, live, BLOCK: tl.constexpr, PAIRED: tl.constexpr = 0,
                     PDL: tl.constexpr = False):
    """Row r's column block; rows from ``live`` on are padding: zeros, nothing read. PAIRED > 0: gate and up
    alternate in blocks of PAIRED columns."""
    pdl.begin(PDL)
    r, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    if r >= live:
        tl.store(out + r * out_stride + cols, tl.zeros([BLOCK], out.dtype.element_ty), mask=ok)
        return
    if PAIRED > 0:
        gate_cols = cols // PAIRED * (2 * PAIRED) + cols % PAIRED
        up_cols = gate_cols + PAIRED
    else:
        gate_cols, up_cols = cols, n_cols + cols
    gate = tl.load(gate_up + r * in_stride + gate_cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up + r * in_stride + up_cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + r * out_stride + cols, silu_times(gate, up).to(out.dtype.element_ty), mask=ok)


def _rows_of(t: torch.Tensor, name: str, cols: int) -> None:
    """``t`` must be [rows, >= cols] with unit column stride (a row may be a slice of a wider fused output)."""
    if t.dim() != 2 or t.shape[1] < cols or t.stride(1) != 1:
        raise ValueError(f"{name} must be [rows, {cols}] with contiguous columns; got {tuple(t.shape)}, "
                         f"strides {t.stride()}")


def add_rms_norm(*, x: torch.Tensor, delta: torch.Tensor | Parts | None, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype, live: int | None = None) -> torch.Tensor:
    """As the reference. ``live``: the rows before it are the batch's, the rest padding (default: all live); a
    padding row's output is zeros and its x and delta are neither read nor written (a decode step keeps them
    zero). ``delta`` may be a split gemm's K parts not yet added (``Parts``): they are added here, in the order and
    to the dtype the gemm's own second launch would (``gemm.linear(unsummed=True)``), so x gets the same bits."""
    rows, cols = x.shape
    _rows_of(x, "x", cols)
    if x.dtype != torch.float32:
        raise ValueError(f"x (the residual stream) must be float32; got {x.dtype}")
    parts = delta if isinstance(delta, Parts) else None
    if parts is not None:
        delta = parts.sums
        if delta.dim() != 3 or delta.dtype != torch.float32 or delta.stride(2) != 1:
            raise ValueError(f"a delta's parts must be float32 [split, {rows}, {cols}], contiguous along a row; got "
                             f"{delta.dtype} {tuple(delta.shape)}")
    if delta is not None and tuple(delta.shape[-2:]) != (rows, cols):
        raise ValueError(f"delta must be [{rows}, {cols}] like x; got {tuple(delta.shape)}")
    out = x.new_empty(rows, cols, dtype=out_dtype)
    if rows:
        split = {} if parts is None else {"PARTS": delta.shape[0], "PART_DTYPE": _TRITON_DTYPES[parts.dtype]}
        _add_rms_norm_kernel[(rows,)](x, x if delta is None else delta, weight, out, cols, x.stride(0),
                                      0 if delta is None else delta.stride(-2), 0 if parts is None else delta.stride(0),
                                      out.stride(0), eps, rows if live is None else live, HAS_DELTA=delta is not None,
                                      BLOCK=triton.next_power_of_2(cols), **split, **pdl.options())
    return out


def gated_rms_norm(*, core: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, rows: int,
                   out_dtype: torch.dtype) -> torch.Tensor:
    batch, hv, dv = core.shape
    _rows_of(z, "z", hv * dv)
    out = z.new_empty(rows, hv * dv, dtype=out_dtype)
    if rows:
        _gated_rms_norm_kernel[(rows, hv)](core.contiguous(), z, z.stride(0), weight, out, out.stride(0), batch, hv,
                                           eps, DV=dv, BLOCK=triton.next_power_of_2(dv), **pdl.options())
    return out


def qk_norm_rope(*, qkv: torch.Tensor, batch: int, positions: torch.Tensor, q_weight: torch.Tensor,
                 k_weight: torch.Tensor, inv_freq: torch.Tensor, eps: float, heads: tuple[int, int],
                 head_dim: int, k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                 kv_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As the reference; with ``k_cache``, ``v_cache`` [pages, page_size, Hkv, D] and ``kv_rows`` [batch] (``page *
    page_size + offset``, distinct) also writes each row's key and value into the caches in the same launch:
    ``write_kv_pages(k_cache=..., v_cache=..., k=k, v=v, slot_mapping=kv_rows)``'s bits."""
    hq, hkv = heads
    _rows_of(qkv, "qkv", (2 * hq + 2 * hkv) * head_dim)
    rotary = 2 * inv_freq.shape[0]
    if not 0 < rotary <= head_dim:
        raise ValueError(f"the rotary width 2 * len(inv_freq) = {rotary} must be in (0, head_dim={head_dim}]")
    to_pages = k_cache is not None
    if to_pages != (v_cache is not None) or to_pages != (kv_rows is not None):
        raise ValueError("k_cache, v_cache and kv_rows go together: pass all three or none")
    if to_pages and (k_cache.dim() != 4 or k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != (hkv, head_dim)
                     or k_cache.stride() != v_cache.stride() or k_cache.stride()[1:] != (hkv * head_dim, head_dim, 1)
                     or tuple(kv_rows.shape) != (batch,)):
        raise ValueError(f"k_cache and v_cache must be [pages, page_size, {hkv}, {head_dim}] alike, contiguous below "
                         f"the page, and kv_rows [{batch}]; got {tuple(k_cache.shape)} strides {k_cache.stride()}, "
                         f"{tuple(v_cache.shape)} strides {v_cache.stride()}, kv_rows {tuple(kv_rows.shape)}")
    q = qkv.new_empty(batch, hq, head_dim, dtype=torch.float32)
    k, v = (qkv.new_empty(batch, hkv, head_dim, dtype=torch.float32) for _ in range(2))
    if batch:
        caches = (k_cache, v_cache, kv_rows, k_cache.stride(0), k_cache.shape[1]) if to_pages else (q, q, q, 0, 1)
        _qk_norm_rope_kernel[(batch, hq + hkv)](qkv, qkv.stride(0), positions, q_weight, k_weight, inv_freq, q, k, v,
                                                hq, hkv, eps, *caches[:4], D=head_dim, ROTARY=rotary,
                                                BLOCK_D=triton.next_power_of_2(head_dim), PAGE=caches[4],
                                                TO_PAGES=to_pages, **pdl.options())
    return q, k, v


def sigmoid_mul(*, attn: torch.Tensor, qkv: torch.Tensor, heads: int, head_dim: int, rows: int,
                out_dtype: torch.dtype) -> torch.Tensor:
    batch = attn.shape[0]
    _rows_of(qkv, "qkv", 2 * heads * head_dim)
    out = attn.new_empty(rows, heads * head_dim, dtype=out_dtype)
    if rows:
        _sigmoid_mul_kernel[(rows, heads)](attn.contiguous(), qkv, qkv.stride(0), out, out.stride(0), batch, heads,
                                           D=head_dim, BLOCK_D=triton.next_power_of_2(head_dim))
    return out


def silu_mul(*, gate_up: torch.Tensor, out_dtype: torch.dtype, live: int | None = None,
             block: int | None = None) -> torch.Tensor:
    """``SiLU(gate) * up`` of ``gate_up`` [rows, 2n] (gate | up: the MLP's fused projection, ``FusedProjection``;
    with ``block``, gate and up alternate in blocks of ``block`` columns, as ``FusedProjection(block=)`` lays them);
    rows from ``live`` on are padding (default: none): zeros, not read."""
    rows, width = gate_up.shape
    _rows_of(gate_up, "gate_up", width)
    if block is not None and (block <= 0 or width % (2 * block)):
        raise ValueError(f"silu_mul(block={block}) needs a gate_up width that is a multiple of 2 * block; got {width}")
    n_cols = width // 2
    out = gate_up.new_empty(rows, n_cols, dtype=out_dtype)
    tile = min(1024, triton.next_power_of_2(n_cols))
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(n_cols, tile))](gate_up, gate_up.stride(0), out, out.stride(0), n_cols,
                                                             rows if live is None else live, BLOCK=tile,
                                                             PAIRED=block or 0, **pdl.options())
    return out
