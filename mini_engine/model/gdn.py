"""Gated DeltaNet token mixer (Qwen3.5 ``linear_attn``), chunk-exact across forward calls.

Per token: a qkv projection through a depthwise causal conv (width 4) and SiLU; q and k
L2-normalised; ``beta = sigmoid(b)``; ``g = -exp(A_log) * softplus(a + dt_bias)``; the gated delta
rule; a gated RMSNorm with ``silu(z)``; the output projection.

Each sequence's new rows are prefixed with its *pending* rows (the tokens since its last 64-token
boundary, kept prepared in its state) so the chunked rule always starts on an absolute boundary:
see ``mini_engine.model.state``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
from torch import nn

from mini_engine.model import kernels as ops
from mini_engine.model.batch import PackedBatch
from mini_engine.model.config import SNAPSHOT_ALIGN, ModelConfig
from mini_engine.model.layers import FusedProjection, GatedRMSNorm, new_linear
from mini_engine.ops import invariant as inv
from mini_engine.ops.gated_delta_rule import chunk_gated_delta_rule

__all__ = ["GatedDeltaNet", "LinearLayerState"]


@dataclass
class LinearLayerState:
    """One linear layer's state for every sequence of a batch (before or after the forward)."""

    conv: torch.Tensor  # [B, conv_dim, W - 1]
    rec: torch.Tensor  # [B, Hv, K, V] at each sequence's last boundary
    pending: list[torch.Tensor]  # per sequence [rows since boundary, pending_width]
    # per sequence, per boundary crossed (or only the last one crossed: ``last_boundary_only``): [conv_dim, W-1]
    boundary_conv: list[list[torch.Tensor]] | None = None
    boundary_rec: list[torch.Tensor] | None = None  # per sequence: [boundaries crossed, Hv, K, V]


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.hk, self.hv = c.linear_num_key_heads, c.linear_num_value_heads
        self.dk, self.dv = c.linear_key_head_dim, c.linear_value_head_dim
        self.key_dim, self.value_dim = c.linear_key_dim, c.linear_value_dim
        self.in_proj_qkv = new_linear(c.hidden_size, c.conv_dim)
        self.in_proj_z = new_linear(c.hidden_size, self.value_dim)
        self.in_proj_b = new_linear(c.hidden_size, self.hv)
        self.in_proj_a = new_linear(c.hidden_size, self.hv)
        self.conv1d = nn.Conv1d(c.conv_dim, c.conv_dim, c.linear_conv_kernel_dim, groups=c.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, c.rms_norm_eps)
        self.out_proj = new_linear(self.value_dim, c.hidden_size)
        self.in_proj = FusedProjection(self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)

    def _prepare(self, h: torch.Tensor, batch: PackedBatch, conv_state: torch.Tensor, kernels: str = "reference"):
        """Projections and conv: returns prepared rows [N, pending_width], the gate z, the conv's input (the
        qkv projection) and its final states."""
        if kernels == "triton":  # one gemm for qkv | z | b | a, the l2 norms, gates and row layout in one row kernel
            from mini_engine.ops.decode_rows.gdn_prepare import gdn_rows

            mixed, z, b, a = ops.linear(kernels, h, self.in_proj.weight()).split(self.in_proj.widths, dim=-1)
            conv = self._conv(mixed, batch, conv_state, kernels)
            rows = gdn_rows(conv=conv.output, a=a, b=b, A_log=self.A_log, dt_bias=self.dt_bias,
                            heads=(self.hk, self.hv), head_dims=(self.dk, self.dv))
            return rows, z, mixed, conv.final_state
        mixed = ops.linear(kernels, h, self.in_proj_qkv.weight)
        conv = self._conv(mixed, batch, conv_state, kernels)
        z = ops.linear(kernels, h, self.in_proj_z.weight)
        q, k, v = conv.output.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = inv.l2_normalize(q.reshape(-1, self.hk, self.dk)).reshape(-1, self.key_dim)
        k = inv.l2_normalize(k.reshape(-1, self.hk, self.dk)).reshape(-1, self.key_dim)
        g, beta = self.gates(h, kernels)
        rows = torch.cat([q, k, v, g, beta], dim=-1)
        return rows, z, mixed, conv.final_state

    def _conv(self, mixed: torch.Tensor, batch: PackedBatch, conv_state: torch.Tensor, kernels: str):
        return ops.conv(kernels, x=mixed, weight=self.conv1d.weight[:, 0], batch=batch, initial_state=conv_state)

    def gates(self, h: torch.Tensor, kernels: str = "reference") -> tuple[torch.Tensor, torch.Tensor]:
        """Per token and value head: the log-decay ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``."""
        beta = inv.sigmoid(ops.linear(kernels, h, self.in_proj_b.weight))
        g = -torch.exp(self.A_log.float()) * inv.softplus(ops.linear(kernels, h, self.in_proj_a.weight) + self.dt_bias)
        return g, beta

    def _split(self, rows: torch.Tensor):
        q, k, v, g, beta = rows.split([self.key_dim, self.key_dim, self.value_dim, self.hv, self.hv], dim=-1)
        return (q.reshape(-1, self.hk, self.dk), k.reshape(-1, self.hk, self.dk),
                v.reshape(-1, self.hv, self.dv), g, beta)

    def forward(self, h: torch.Tensor, batch: PackedBatch, state: LinearLayerState, kernels: str = "reference",
                last_boundary_only: bool = False):
        """``kernels``: the sequence ops' and projections' implementation (``mini_engine.model.kernels``).
        ``last_boundary_only``: the conv states of the last boundary each sequence crosses, not of all."""
        rows, z, mixed, conv_final = self._prepare(h, batch, state.conv, kernels)
        # each sequence's pending rows, then its new ones, all sequences in one copy
        packed = torch.cat([t for i in range(batch.size) for t in (state.pending[i], rows[batch.rows(i)])])
        totals = [state.pending[i].shape[0] + batch.lengths[i] for i in range(batch.size)]
        starts = [0, *accumulate(totals)]  # host ints: slicing by them costs no tensor op
        cu = torch.tensor(starts)
        q, k, v, g, beta = self._split(packed)
        result = ops.gated_delta_rule(kernels, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, initial_state=state.rec)
        outputs, new_rec, new_pending, boundary_conv = [], [], [], []
        for i in range(batch.size):
            n_pending, n_total = state.pending[i].shape[0], totals[i]
            outputs.append(result.output[starts[i] + n_pending : starts[i] + n_total])
            crossed = result.boundary_states[i]
            new_rec.append(crossed[-1] if crossed.shape[0] else state.rec[i])
            new_pending.append(packed[starts[i] + n_total - n_total % SNAPSHOT_ALIGN : starts[i] + n_total])
            boundary_conv.append(self._boundary_conv(state.conv[i], mixed[batch.rows(i)], batch.starts[i],
                                                     last_boundary_only))
        new_state = LinearLayerState(conv_final, torch.stack(new_rec), new_pending, boundary_conv,
                                     result.boundary_states)
        return self._output(torch.cat(outputs), z, kernels), new_state

    def forward_from_start(self, h: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """The output of sequences that all start at position 0, and nothing else: no state is kept,
        so it is differentiable end to end (the training forward)."""
        if any(batch.starts):
            raise ValueError(f"forward_from_start needs every sequence to start at 0; got starts {batch.starts}")
        zeros = h.new_zeros(batch.size, self.conv1d.weight.shape[0], self.conv1d.weight.shape[-1] - 1)
        rows, z, _, _ = self._prepare(h, batch, zeros)
        q, k, v, g, beta = self._split(rows)
        result = chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=batch.cu_seqlens)
        return self._output(result.output, z)

    def _output(self, core: torch.Tensor, z: torch.Tensor, kernels: str = "reference") -> torch.Tensor:
        """Gated RMSNorm of the rule's output [N, Hv, V] with silu(z), then the output projection ("triton": the
        norm in one row kernel, the decode step's)."""
        if kernels == "triton":
            from mini_engine.ops.decode_rows.triton import gated_rms_norm

            gated = gated_rms_norm(core=core, z=z, weight=self.norm.weight, eps=self.norm.eps, rows=core.shape[0],
                                   out_dtype=torch.float32)
        else:
            gated = self.norm(core.reshape(-1, self.dv), z.reshape(-1, self.dv)).reshape(-1, self.value_dim)
        return ops.linear(kernels, gated, self.out_proj.weight)

    @staticmethod
    def _boundary_conv(history: torch.Tensor, mixed: torch.Tensor, start: int, last_only: bool = False
                       ) -> list[torch.Tensor]:
        """Conv state (last W-1 inputs) at every 64-boundary in (start, start + n], or at the last one only."""
        first = start // SNAPSHOT_ALIGN * SNAPSHOT_ALIGN + SNAPSHOT_ALIGN
        positions = range(first, start + mixed.shape[0] + 1, SNAPSHOT_ALIGN)
        return [GatedDeltaNet._conv_inputs_before(history, mixed, p - start)
                for p in (positions[-1:] if last_only else positions)]

    @staticmethod
    def _conv_inputs_before(history: torch.Tensor, mixed: torch.Tensor, row: int) -> torch.Tensor:
        """The conv state [C, W-1] before new row ``row`` (>= 1): the last W-1 inputs, from ``mixed`` [n, C] (the
        new rows) and, when it holds fewer than W-1 before ``row``, ``history`` [C, W-1] (the inputs before them)."""
        lo = row - history.shape[1]
        if lo >= 0:
            return mixed[lo:row].t().contiguous()
        return torch.cat([history[:, lo:], mixed[:row].t()], dim=1)
