"""Gated full attention (Qwen3.5 ``self_attn``): output gate, per-head q/k RMSNorm, partial RoPE, GQA.

``q_proj`` emits, per head, the query followed by an output gate of the same width; the attention
output is multiplied by ``sigmoid(gate)`` before ``o_proj``.
"""

from __future__ import annotations

from itertools import accumulate

import torch
from torch import nn

from mini_engine.model import kernels as ops
from mini_engine.model.batch import PackedBatch
from mini_engine.model.config import ModelConfig
from mini_engine.model.layers import FusedProjection, OffsetRMSNorm, Rotary, new_linear
from mini_engine.ops import invariant as inv

__all__ = ["GatedAttention"]


class GatedAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.hq, self.hkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = new_linear(c.hidden_size, self.hq * self.d * 2)
        self.k_proj = new_linear(c.hidden_size, self.hkv * self.d)
        self.v_proj = new_linear(c.hidden_size, self.hkv * self.d)
        self.o_proj = new_linear(self.hq * self.d, c.hidden_size)
        self.q_norm = OffsetRMSNorm(self.d, c.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.d, c.rms_norm_eps)
        self.rotary = Rotary(c)
        self.qkv = FusedProjection(self.q_proj, self.k_proj, self.v_proj)  # q (with its gates) | k | v

    def forward(self, h: torch.Tensor, batch: PackedBatch, past_keys: list[torch.Tensor],
                past_values: list[torch.Tensor], kernels: str = "reference"):
        """past_*: per sequence [start, Hkv, D]. Returns (output, new keys, new values) with new K/V [N, Hkv, D].
        ``kernels``: the attention's implementation (``mini_engine.model.kernels``)."""
        n = h.shape[0]
        positions = batch.positions_on(h.device)
        if kernels == "triton":  # one gemm for q | k | v; norms, RoPE and layout in one row kernel (the decode step's)
            from mini_engine.ops.decode_rows.triton import qk_norm_rope

            qkv = ops.linear(kernels, h, self.qkv.weight())
            q, k, v = qk_norm_rope(qkv=qkv, batch=n, positions=positions, q_weight=self.q_norm.weight,
                                   k_weight=self.k_norm.weight, inv_freq=self.rotary.frequencies(h.device),
                                   eps=self.q_norm.eps, heads=(self.hq, self.hkv), head_dim=self.d)
        else:
            q_gate = ops.linear(kernels, h, self.q_proj.weight)  # per query head: its d query channels, then its gate's
            q, gate = q_gate.reshape(n, self.hq, 2 * self.d).chunk(2, dim=-1)
            q = self.rotary(self.q_norm(q), positions)
            k = ops.linear(kernels, h, self.k_proj.weight).reshape(n, self.hkv, self.d)
            k = self.rotary(self.k_norm(k), positions)
            v = ops.linear(kernels, h, self.v_proj.weight).reshape(n, self.hkv, self.d)
        keys = torch.cat([t for i in range(batch.size) for t in (past_keys[i], k[batch.rows(i)])])
        values = torch.cat([t for i in range(batch.size) for t in (past_values[i], v[batch.rows(i)])])
        key_lengths = [batch.starts[i] + batch.lengths[i] for i in range(batch.size)]
        cu_k = torch.tensor([0, *accumulate(key_lengths)])
        out = ops.attention(kernels, q=q, k=keys, v=values, batch=batch, cu_seqlens_k=cu_k)
        if kernels == "triton":
            from mini_engine.ops.decode_rows.triton import sigmoid_mul

            out = sigmoid_mul(attn=out, qkv=qkv, heads=self.hq, head_dim=self.d, rows=n, out_dtype=torch.float32)
        else:
            out = out.reshape(n, self.hq * self.d) * inv.sigmoid(gate.reshape(n, self.hq * self.d))
        return ops.linear(kernels, out, self.o_proj.weight), k, v
