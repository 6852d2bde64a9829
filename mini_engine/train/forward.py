"""The training forward: whole sequences from position 0, differentiable, on the model's own modules.

The inference forward (``HybridModel.forward``) carries states, pending rows and snapshots for the
cache and runs without gradients. Training needs none of that: every sequence starts at 0 and ends
with the batch, so each layer runs its from-start form over the packed batch and the result is the
logits of every position. The arithmetic is the same reference ops; only ``inv.linear`` takes its
one-matmul form (under autograd nothing is compared bit for bit).
"""

from __future__ import annotations

import torch

from mini_engine.model.batch import PackedBatch
from mini_engine.model.config import LINEAR
from mini_engine.model.hybrid import HybridModel, MediaRows
from mini_engine.ops import invariant as inv

__all__ = ["sequence_logits"]


def sequence_logits(model: HybridModel, tokens: list[torch.Tensor],
                    media: list[MediaRows | None] | None = None) -> torch.Tensor:
    """Logits [sum of lengths, vocab] of every position of each sequence (1-D token tensors), packed."""
    batch = PackedBatch((0,) * len(tokens), tuple(t.numel() for t in tokens))
    x = model._embed(tokens, batch, media)
    for layer in model.model.layers:
        h = layer.input_layernorm(x)
        if layer.layer_type == LINEAR:
            out = layer.linear_attn.forward_from_start(h, batch)
        else:
            attn = layer.self_attn
            empty = [h.new_zeros(0, attn.hkv, attn.d)] * batch.size
            out, _, _ = attn(h, batch, empty, empty)
        x = x + out
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return inv.linear(model.model.norm(x), model.head_weight)
