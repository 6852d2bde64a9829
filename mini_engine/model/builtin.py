"""Models that need no download, over the byte tokenizer.

``tiny-random``: ~1.8 M parameters, 8 layers in the 3:1 Gated DeltaNet : attention pattern, hidden
128. Its weights come from a fixed seed, so every machine builds the same model; it answers no probe,
so only the reference oracle can judge it.

``probe-tiny`` (the default, ``DEFAULT_MODEL``): the same shape trained on the probe grammar
(``mini-engine train --recipe probe-tiny``), shipped as a checkpoint inside the package with the
record of how it was trained (``checkpoints/probe-tiny/training.json``). It answers the probes, so
ground truth judges the embedded engine as it judges a production model.

``qwen3.5-0.8b-shaped-random`` (``QWEN35_08B``): Qwen3.5-0.8B's shape (hidden 1,024, 24 layers in the 3:1
pattern, 16 linear key and value heads of 128, 8 query and 2 KV attention heads of 256, intermediate 3,584, a
tied embedding) with seeded random weights, over the byte tokenizer's ids: 0.5 B parameters, 1.0 GB in
bfloat16, 19 MB of recurrent state a slot. The engine at a production model's size, for the GPU (building it
on a CPU takes some seconds and 3 GB); ``QWEN35_VOCAB`` ids instead of the byte tokenizer's give the real
model's 0.5 GB embedding too (``dataclasses.replace(builtin_config(QWEN35_08B), vocab_size=QWEN35_VOCAB)``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from mini_engine.model.config import FULL, LINEAR, ModelConfig
from mini_engine.model.hybrid import HybridModel
from mini_engine.model.tokenizer import ByteTokenizer

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "PACKAGED_MODELS",
    "QWEN35_08B",
    "QWEN35_VOCAB",
    "build_builtin",
    "builtin_config",
    "init_weights",
]

DEFAULT_SEED = 20261202
# Below 1, so that float32 rounding is not amplified through the layers (measured against float64:
# gain 0.7 keeps logits O(1) with ~4e-6 error; gain 1.0 amplifies it tenfold).
WEIGHT_GAIN = 0.7


def _over_byte_ids(name: str, *, blocks: int, **shape) -> ModelConfig:
    """A config of ``shape`` in ``blocks`` of the 3:1 pattern (three Gated DeltaNet layers, then attention), over
    the byte tokenizer's ids and end-of-sequence tokens."""
    tokenizer = ByteTokenizer()
    return ModelConfig(vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_ids, name=name,
                       layer_types=(LINEAR, LINEAR, LINEAR, FULL) * blocks, max_position_embeddings=8192, **shape)


def _tiny_config() -> ModelConfig:
    return _over_byte_ids("tiny-random", blocks=2, hidden_size=128, intermediate_size=384, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                          linear_key_head_dim=32, linear_value_head_dim=32, rope_theta=10_000.0,
                          tie_word_embeddings=False)


QWEN35_08B = "qwen3.5-0.8b-shaped-random"
QWEN35_VOCAB = 248_320  # Qwen3.5's vocabulary: the real 0.8B model's tied embedding and head, 0.5 GB in bfloat16


def _qwen35_08b_config() -> ModelConfig:
    return _over_byte_ids(QWEN35_08B, blocks=6, hidden_size=1024, intermediate_size=3584, num_attention_heads=8,
                          num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
                          linear_key_head_dim=128, linear_value_head_dim=128, tie_word_embeddings=True)


BUILTIN_MODELS = {"tiny-random": _tiny_config, QWEN35_08B: _qwen35_08b_config}
PACKAGED_MODELS = {"probe-tiny": Path(__file__).resolve().parent / "checkpoints" / "probe-tiny"}
DEFAULT_MODEL = "probe-tiny"


def builtin_config(name: str) -> ModelConfig:
    if name not in BUILTIN_MODELS:
        raise ValueError(f"unknown built-in model {name!r}; available: {sorted(BUILTIN_MODELS)}")
    return BUILTIN_MODELS[name]()


@torch.no_grad()
def init_weights(model: HybridModel, seed: int = DEFAULT_SEED) -> HybridModel:
    """Deterministic random weights with the scales of a trained model (so logits are not flat)."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if name.startswith("media_projector."):
            continue  # seeded by its own constructor, so adding it changed no other weight
        if name.endswith("A_log"):
            # Decays from ~0.5% to ~95% per token: long-memory heads like a trained model's, so a
            # wrong recurrent state changes the output (with A_log in (0, 2.7) every head forgot
            # within a few tokens and a blank snapshot usually went unnoticed).
            param.copy_(torch.empty(param.shape).uniform_(-5.0, 1.0, generator=gen))
        elif name.endswith("dt_bias"):
            param.copy_(torch.empty(param.shape).uniform_(-1.0, 1.0, generator=gen))
        elif name.endswith("norm.weight") and "linear_attn" in name:
            param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
        elif name.endswith("norm.weight") or "layernorm" in name:
            param.copy_(0.1 * torch.randn(param.shape, generator=gen))
        elif "embed_tokens" in name:
            param.copy_(torch.randn(param.shape, generator=gen))
        else:
            param.copy_(torch.randn(param.shape, generator=gen) * WEIGHT_GAIN * param.shape[-1] ** -0.5)
    return model


def build_builtin(name: str = "tiny-random", seed: int = DEFAULT_SEED) -> HybridModel:
    return init_weights(HybridModel(builtin_config(name)), seed).eval()
