"""The Qwen3.5-style hybrid decoder: Gated DeltaNet and gated full-attention layers, SwiGLU MLPs.

``HybridModel.forward`` takes the new tokens of several sequences with each one's ``SequenceState``
and returns, per sequence, logits, the advanced state and the snapshots at every 64-token
boundary it crossed. Parameter names match Hugging Face's ``Qwen3_5ForCausalLM``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

import torch
from torch import nn

from mini_engine.device import upload
from mini_engine.model import kernels as ops
from mini_engine.model.attention import GatedAttention
from mini_engine.model.batch import PackedBatch
from mini_engine.model.config import LINEAR, SNAPSHOT_ALIGN, ModelConfig
from mini_engine.model.gdn import GatedDeltaNet, LinearLayerState
from mini_engine.model.kernels import check_kernels
from mini_engine.model.layers import OffsetRMSNorm, SwiGLU, new_linear
from mini_engine.model.media import MediaProjector
from mini_engine.model.state import SequenceState, Snapshot

__all__ = ["SNAPSHOT_CHOICES", "HybridModel", "MediaRows", "StepOutput"]

SNAPSHOT_CHOICES = ("all", "last")  # HybridModel.forward(snapshots=...)

# Per sequence: (rows of its new tokens that are media placeholders, their [n, MEDIA_FEATURES] features).
MediaRows = tuple[torch.Tensor, torch.Tensor]


@dataclass
class StepOutput:
    logits: torch.Tensor  # [new tokens, vocab] if all_logits else [1, vocab] (the last token)
    state: SequenceState
    snapshots: list[Snapshot]  # one per 64-boundary crossed by this forward, in order (snapshots="last": the last)


class _Inputs(NamedTuple):
    """A forward's input states, with every sequence's linear states stacked once for all layers: a layer reads
    its [B, ...] slice in place (one copy per forward, not one per layer)."""

    states: list[SequenceState]
    conv: torch.Tensor | None  # [B, L_linear, conv_dim, W - 1]
    rec: torch.Tensor | None  # [B, L_linear, Hv, K, V]

    @classmethod
    def of(cls, states: list[SequenceState], linear: bool) -> _Inputs:
        if not linear:
            return cls(states, None, None)
        return cls(states, torch.stack([s.conv for s in states]), torch.stack([s.rec for s in states]))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_type: str) -> None:
        super().__init__()
        self.layer_type = layer_type
        if layer_type == LINEAR:
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = GatedAttention(config)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.input_layernorm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)


class TextModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, t) for t in config.layer_types)
        self.norm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)


class HybridModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = TextModel(config)
        self.lm_head = None if config.tie_word_embeddings else new_linear(config.hidden_size, config.vocab_size)
        self.media_projector = MediaProjector(config.hidden_size)  # not a Qwen3.5 tensor: optional on load

    @property
    def head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def device(self) -> torch.device:
        return self.head_weight.device

    @property
    def projection_dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def cast_projections(self, dtype: torch.dtype) -> HybridModel:
        """Every projection's weight (linear layers, embedding, head) to ``dtype``, in place; norms, conv, gate
        parameters and the media projector stay as they are (a projection computes in the weight's dtype
        and returns the input's). Returns the model."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.data = module.weight.data.to(dtype)
        return self

    def new_state(self) -> SequenceState:
        return SequenceState.empty(self.config, device=self.device)

    @torch.no_grad()
    def forward(self, tokens: list[torch.Tensor], states: list[SequenceState], *,
                all_logits: bool = False, media: list[MediaRows | None] | None = None,
                kernels: str = "reference", snapshots: str = "all") -> list[StepOutput]:
        """Advance each sequence by its new ``tokens`` (1-D long tensors) from its ``state``.

        ``media[i]``, if given, replaces the embeddings of sequence i's placeholder rows with the
        projection of their media features. ``kernels``: "reference" or "triton", the implementation of
        the conv, gated delta rule, attention and the projections (``mini_engine.model.kernels``).
        ``snapshots``: "all" (the linear state at every 64-boundary each sequence crosses) or "last" (at the
        last one only: what an engine's track snapshot keeps, without a stack and a copy per other boundary)."""
        check_kernels(kernels)
        if snapshots not in SNAPSHOT_CHOICES:
            raise ValueError(f"snapshots must be one of {SNAPSHOT_CHOICES}; got {snapshots!r}")
        if len(tokens) != len(states) or (media is not None and len(media) != len(tokens)):
            raise ValueError(f"{len(tokens)} token tensors for {len(states)} states"
                             + ("" if media is None else f" and {len(media)} media entries"))
        for t, state in zip(tokens, states):
            if t.dim() != 1 or t.numel() == 0 or not 0 <= int(t.min()) <= int(t.max()) < self.config.vocab_size:
                raise ValueError(f"tokens must be non-empty 1-D ids in [0, {self.config.vocab_size}); "
                                 f"got shape {tuple(t.shape)}")
            state.check()
        batch = PackedBatch(tuple(s.length for s in states), tuple(t.numel() for t in tokens))
        x = self._embed(tokens, batch, media)
        linear_out, kv_out = [], []
        inputs = _Inputs.of(states, bool(self.config.linear_layers))
        delta = None  # "triton": the last block's output, not yet added to x (the next norm adds it)
        for layer in self.model.layers:
            x, delta, produced = self._layer(layer, x, delta, batch, inputs, len(linear_out), len(kv_out), kernels,
                                             snapshots == "last")
            (linear_out if layer.layer_type == LINEAR else kv_out).append(produced)
        x = self._norm(self.model.norm, x, delta, kernels)
        picks = [batch.rows(i) if all_logits else slice(batch.rows(i).stop - 1, batch.rows(i).stop)
                 for i in range(batch.size)]
        logits = ops.linear(kernels, torch.cat([x[p] for p in picks]), self.head_weight)
        bounds = [0, *accumulate(p.stop - p.start for p in picks)]
        return [StepOutput(logits[bounds[i] : bounds[i + 1]],
                           *self._advance(i, batch, states[i], linear_out, kv_out, snapshots == "last"))
                for i in range(batch.size)]

    def _embed(self, tokens: list[torch.Tensor], batch: PackedBatch, media: list[MediaRows | None] | None):
        # Prompt tokens come from the host (one upload for the batch), decode tokens from the device: the weights'
        # device decides.
        if all(t.device.type == "cpu" for t in tokens):
            ids = upload(torch.cat(tokens), self.device)
        else:
            ids = torch.cat([upload(t, self.device) for t in tokens])
        x = self.model.embed_tokens(ids).float()
        for i, entry in enumerate(media or ()):
            if entry is not None:
                rows, features = entry
                x[upload(batch.rows(i).start + rows, self.device)] = self.media_projector(upload(features, self.device))
        return x

    @staticmethod
    def _norm(norm: OffsetRMSNorm, x: torch.Tensor, delta: torch.Tensor | None, kernels: str) -> torch.Tensor:
        """``norm(x + delta)``. "triton": one row kernel (the decode step's) that also adds ``delta`` into ``x`` in
        place; the reference path adds as it goes and always passes None."""
        if kernels != "triton":
            return norm(x)
        from mini_engine.ops.decode_rows.triton import add_rms_norm

        return add_rms_norm(x=x, delta=delta, weight=norm.weight, eps=norm.eps, out_dtype=torch.float32)

    def _layer(self, layer: DecoderLayer, x, delta, batch, inputs: _Inputs, lin_idx: int, full_idx: int, kernels: str,
               last_boundary_only: bool):
        """One decoder layer: returns (x, the MLP's output still to add (the triton path) or None, what the mixer
        produced for the state)."""
        h = self._norm(layer.input_layernorm, x, delta, kernels)
        if layer.layer_type == LINEAR:
            state = LinearLayerState(inputs.conv[:, lin_idx], inputs.rec[:, lin_idx],
                                     [s.pending[lin_idx] for s in inputs.states])
            out, produced = layer.linear_attn(h, batch, state, kernels, last_boundary_only)
        else:
            out, k, v = layer.self_attn(h, batch, [s.keys[full_idx] for s in inputs.states],
                                        [s.values[full_idx] for s in inputs.states], kernels)
            produced = (k, v)
        if kernels == "triton":
            return x, layer.mlp(self._norm(layer.post_attention_layernorm, x, out, kernels), kernels), produced
        x = x + out
        return x + layer.mlp(layer.post_attention_layernorm(x), kernels), None, produced

    @staticmethod
    def _advance(i: int, batch: PackedBatch, old: SequenceState, linear_out: list[LinearLayerState],
                 kv_out: list[tuple[torch.Tensor, torch.Tensor]], last_only: bool,
                 ) -> tuple[SequenceState, list[Snapshot]]:
        rows = batch.rows(i)
        # [layers, old length + new, Hkv, D]: two copies per tensor, not one per layer and a stack
        keys = torch.cat([old.keys, torch.stack([k[rows] for k, _ in kv_out])], dim=1) if kv_out else old.keys
        values = torch.cat([old.values, torch.stack([v[rows] for _, v in kv_out])], dim=1) if kv_out else old.values
        state = SequenceState(
            length=old.length + batch.lengths[i],
            conv=torch.stack([l.conv[i] for l in linear_out]) if linear_out else old.conv,
            rec=torch.stack([l.rec[i] for l in linear_out]) if linear_out else old.rec,
            pending=(torch.stack([l.pending[i] for l in linear_out]) if linear_out
                     else old.pending.new_zeros(0, (old.length + batch.lengths[i]) % SNAPSHOT_ALIGN, 0)),
            keys=keys,
            values=values,
        )
        first = old.length // SNAPSHOT_ALIGN * SNAPSHOT_ALIGN + SNAPSHOT_ALIGN
        positions = range(first, state.length + 1, SNAPSHOT_ALIGN)
        # boundary_conv holds the last boundary only when last_only; boundary_rec always holds them all
        picks = [(len(positions) - 1, 0, positions[-1])] if last_only and positions else [
            (b, b, p) for b, p in enumerate(positions)]
        snapshots = [Snapshot(p, torch.stack([l.boundary_conv[i][c] for l in linear_out]),
                              torch.stack([l.boundary_rec[i][b] for l in linear_out]))
                     for b, c, p in picks] if linear_out else []
        return state, snapshots
