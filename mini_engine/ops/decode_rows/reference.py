"""The per-row pieces of a decode step, in float32 torch: the specification of ``triton.py``.

A decode step keeps its hidden states as ``[P, hidden]`` with ``P`` the batch rounded up to the
linear layers' 64-row tile (``inv.ROW_TILE``) and the padding rows zero, so every projection is a
fixed-shape gemm on its input as it is. Each function here is the arithmetic the model's modules do
(``mini_engine.model.layers``, ``gdn``, ``attention``), on such rows:

- ``add_rms_norm``: the residual add, then the offset RMSNorm of the sum;
- ``gdn_rows``: a Gated DeltaNet token's prepared row ``q|k|v|g|beta`` from its conv output and gate
  projections (``mini_engine.model.state`` keeps these rows);
- ``gated_rms_norm``: the GDN output norm ``w * rmsnorm(core) * silu(z)`` per value head;
- ``qk_norm_rope``: attention's per-head q/k RMSNorm and partial RoPE;
- ``sigmoid_mul`` and ``silu_mul``: attention's output gate and the SwiGLU activation;
- ``decode_prologue``: the step's per-sequence indices and its embedded, padded residual rows
  (the Triton form is ``prologue.py``).

Outputs that feed a projection have ``rows`` rows (zero past the batch) in the projection weight's
dtype; the rest are float32 and have one row per sequence.
"""

from __future__ import annotations

import torch

from mini_engine.ops import invariant as inv

__all__ = ["add_rms_norm", "decode_prologue", "gated_rms_norm", "gdn_rows", "qk_norm_rope", "sigmoid_mul", "silu_mul"]


def _padded(values: torch.Tensor, rows: int, dtype: torch.dtype) -> torch.Tensor:
    out = values.new_zeros(rows, *values.shape[1:], dtype=dtype)
    out[: values.shape[0]] = values.to(dtype)
    return out


def add_rms_norm(*, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype) -> torch.Tensor:
    """``x += delta`` (in place, float32) when ``delta`` is given; returns ``rms_norm(x) * (1 + weight)``."""
    if delta is not None:
        x += delta.float()
    return (inv.rms_norm(x, eps) * (1.0 + weight.float())).to(out_dtype)


def gdn_rows(*, conv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
             heads: tuple[int, int], head_dims: tuple[int, int]) -> torch.Tensor:
    """Rows [B, 2*Hk*K + Hv*V + 2*Hv] from conv outputs [B, 2*Hk*K + Hv*V] (after SiLU) and a, b [B, Hv]:
    q and k L2-normalised per key head, v as is, ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``."""
    (hk, _), (dk, _) = heads, head_dims
    key_dim = hk * dk
    q, k, v = conv.float().split([key_dim, key_dim, conv.shape[1] - 2 * key_dim], dim=-1)
    q = inv.l2_normalize(q.reshape(-1, hk, dk)).reshape(-1, key_dim)
    k = inv.l2_normalize(k.reshape(-1, hk, dk)).reshape(-1, key_dim)
    g = -torch.exp(A_log.float()) * inv.softplus(a.float() + dt_bias.float())
    return torch.cat([q, k, v, g, inv.sigmoid(b.float())], dim=-1)


def gated_rms_norm(*, core: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, rows: int,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """``weight * rms_norm(core) * silu(z)`` per value head; core [B, Hv, V], z [>= B, Hv * V] -> [rows, Hv * V]."""
    batch, hv, dv = core.shape
    gate = z[:batch].float().reshape(batch, hv, dv)
    out = weight.float() * inv.rms_norm(core.float(), eps) * inv.silu(gate)
    return _padded(out.reshape(batch, hv * dv), rows, out_dtype)


def qk_norm_rope(*, qkv: torch.Tensor, batch: int, positions: torch.Tensor, q_weight: torch.Tensor,
                 k_weight: torch.Tensor, inv_freq: torch.Tensor, eps: float, heads: tuple[int, int],
                 head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From fused projections [>= B, Hq * 2D | Hkv * D | Hkv * D] (per query head: query, then its output gate):
    q [B, Hq, D] and k [B, Hkv, D] offset-RMSNormed per head and rotated (rotate-half RoPE on the first
    ``2 * len(inv_freq)`` channels at ``positions``), v [B, Hkv, D]; all float32."""
    hq, hkv = heads
    d = head_dim
    rows = qkv[:batch].float()
    q = rows[:, : hq * 2 * d].reshape(batch, hq, 2 * d)[..., :d]
    k = rows[:, hq * 2 * d : hq * 2 * d + hkv * d].reshape(batch, hkv, d)
    v = rows[:, hq * 2 * d + hkv * d :].reshape(batch, hkv, d)

    def norm_rope(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return inv.rope(inv.rms_norm(x, eps) * (1.0 + weight.float()), positions, inv_freq)

    return norm_rope(q, q_weight), norm_rope(k, k_weight), v.contiguous()


def sigmoid_mul(*, attn: torch.Tensor, qkv: torch.Tensor, heads: int, head_dim: int, rows: int,
                out_dtype: torch.dtype) -> torch.Tensor:
    """``attn * sigmoid(gate)``: attn [B, Hq, D], the gates the second half of each query head's 2D columns of
    ``qkv``; -> [rows, Hq * D]."""
    batch = attn.shape[0]
    gate = qkv[:batch, : heads * 2 * head_dim].float().reshape(batch, heads, 2 * head_dim)[..., head_dim:]
    return _padded((attn.float() * inv.sigmoid(gate)).reshape(batch, heads * head_dim), rows, out_dtype)


def silu_mul(*, gate_up: torch.Tensor, out_dtype: torch.dtype, block: int | None = None) -> torch.Tensor:
    """``silu(gate) * up`` for gate_up [rows, 2I] = [gate | up] -> [rows, I]; with ``block``, gate and up alternate
    in blocks of ``block`` columns (``FusedProjection(block=)``)."""
    if block is None:
        gate, up = gate_up.float().chunk(2, dim=-1)
    else:
        gate, up = gate_up.float().unflatten(-1, (-1, 2, block)).unbind(-2)
        gate, up = gate.flatten(-2), up.flatten(-2)
    return (inv.silu(gate) * up).to(out_dtype)


def decode_prologue(*, inputs: torch.Tensor, page_table: torch.Tensor, page_size: int, align: int,
                    tokens: torch.Tensor, embedding: torch.Tensor, rows: int,
                    by_slot: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """From a step's ``inputs`` [3, B] (slots, positions, pending slots), its page table [B, pages] and its tokens
    ([B], or with ``by_slot`` a per-slot pool read at the slots): x [rows, hidden] float32, the tokens' embeddings
    then zero rows, and index [7, B] long, the rows of ``prologue.INDEX_FIELDS``: slots; positions; the token's row
    in its chunk (position % align); pending slots; where the new pending row goes (that row, at most align - 2);
    keys after the token (position + 1); the new key's row in the flattened pages (page * page_size + offset)."""
    slots, positions, pending_slots = inputs.long().unbind(0)
    chunk_rows = positions % align
    pages = page_table.gather(1, (positions // page_size)[:, None]).squeeze(1).long()
    index = torch.stack([slots, positions, chunk_rows, pending_slots, chunk_rows.clamp(max=align - 2), positions + 1,
                         pages * page_size + positions % page_size])
    ids = tokens[slots] if by_slot else tokens
    x = embedding.new_zeros(rows, embedding.shape[1], dtype=torch.float32)
    x[: ids.shape[0]] = embedding[ids.long()].float()
    return x, index
