"""Model configuration: a Qwen3.5-style hybrid decoder, validated on construction.

Field names follow Hugging Face's ``Qwen3_5TextConfig`` so that ``config.json`` maps one to one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mini_engine.constants import SNAPSHOT_ALIGN

__all__ = ["ModelConfig", "LINEAR", "FULL", "SNAPSHOT_ALIGN"]

LINEAR = "linear_attention"
FULL = "full_attention"



@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    eos_token_id: tuple[int, ...] = ()
    name: str = "custom"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        eos = self.eos_token_id
        object.__setattr__(self, "eos_token_id", (eos,) if isinstance(eos, int) else tuple(eos or ()))
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                     "linear_value_head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int; got {value!r}")
        if not self.layer_types:
            raise ValueError("ModelConfig.layer_types must name at least one layer")
        bad = sorted({t for t in self.layer_types if t not in (LINEAR, FULL)})
        if bad:
            raise ValueError(f"ModelConfig.layer_types has {bad}; allowed: {LINEAR!r}, {FULL!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"ModelConfig.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"ModelConfig.linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple "
                             f"of linear_num_key_heads ({self.linear_num_key_heads})")
        if self.linear_conv_kernel_dim < 2:
            raise ValueError(f"ModelConfig.linear_conv_kernel_dim must be >= 2; got {self.linear_conv_kernel_dim}")
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            raise ValueError(f"ModelConfig.partial_rotary_factor ({self.partial_rotary_factor}) must give an even "
                             f"rotary dim in (0, head_dim={self.head_dim}]; got {self.rotary_dim}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("ModelConfig.rms_norm_eps and rope_theta must be > 0")
        for token in self.eos_token_id:
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"ModelConfig.eos_token_id {token} is outside the vocabulary [0, {self.vocab_size})")

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @classmethod
    def from_hf(cls, raw: dict[str, Any], name: str = "custom") -> ModelConfig:
        """Build from a Hugging Face ``config.json`` (Qwen3.5 text, the multimodal wrapper, or Qwen3-Next)."""
        cfg = raw.get("text_config", raw)
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        layer_types = cfg.get("layer_types")
        if layer_types is None:
            interval = cfg.get("full_attention_interval", 4)
            layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(cfg["num_hidden_layers"])]
        try:
            return cls(
                vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                intermediate_size=cfg["intermediate_size"], layer_types=tuple(layer_types),
                num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
                linear_num_key_heads=cfg["linear_num_key_heads"],
                linear_num_value_heads=cfg["linear_num_value_heads"],
                linear_key_head_dim=cfg["linear_key_head_dim"], linear_value_head_dim=cfg["linear_value_head_dim"],
                linear_conv_kernel_dim=cfg.get("linear_conv_kernel_dim", 4),
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10_000_000.0)),
                partial_rotary_factor=rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)),
                tie_word_embeddings=raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)),
                max_position_embeddings=cfg.get("max_position_embeddings", 32768),
                eos_token_id=cfg.get("eos_token_id", raw.get("eos_token_id")) or (),
                name=name, extra={"model_type": raw.get("model_type", cfg.get("model_type"))},
            )
        except KeyError as missing:
            raise ValueError(f"config.json lacks required field {missing}") from None

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` that ``transformers`` reads as ``Qwen3_5ForCausalLM``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("rope_theta", "partial_rotary_factor", "name", "extra", "eos_token_id")}
        out["layer_types"] = list(self.layer_types)
        out["num_hidden_layers"] = self.num_hidden_layers
        out["eos_token_id"] = list(self.eos_token_id) if len(self.eos_token_id) != 1 else self.eos_token_id[0]
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta,
                                  "partial_rotary_factor": self.partial_rotary_factor}
        out["model_type"] = "qwen3_5_text"
        out["architectures"] = ["Qwen3_5ForCausalLM"]
        out["hidden_act"] = "silu"
        return out
