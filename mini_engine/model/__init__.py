"""The Qwen3.5-style hybrid model: config, byte tokenizer, the built-in models (tiny and Qwen3.5-0.8B-shaped,
seeded) and the packaged tiny one, HF checkpoint loader."""

from pathlib import Path

from mini_engine.model.builtin import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    PACKAGED_MODELS,
    build_builtin,
)
from mini_engine.model.config import ModelConfig
from mini_engine.model.hybrid import HybridModel, StepOutput
from mini_engine.model.loader import CheckpointError, load_pretrained, save_pretrained
from mini_engine.model.state import SequenceState, Snapshot
from mini_engine.model.tokenizer import ByteTokenizer

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "PACKAGED_MODELS",
    "ByteTokenizer",
    "CheckpointError",
    "HybridModel",
    "ModelConfig",
    "SequenceState",
    "Snapshot",
    "StepOutput",
    "build_builtin",
    "check_model_name",
    "load_model",
    "load_pretrained",
    "save_pretrained",
]


def load_model(name_or_path: str | None = None) -> HybridModel:
    """A model by name (default ``DEFAULT_MODEL``: the packaged ``probe-tiny``; ``tiny-random`` and
    ``qwen3.5-0.8b-shaped-random`` are built from a seed) or a checkpoint folder by path.

    Raises ValueError for a name that is none of these (``CheckpointError`` for a folder that does not load)."""
    name = check_model_name(name_or_path)
    if name in BUILTIN_MODELS:
        return build_builtin(name)
    return load_pretrained(PACKAGED_MODELS.get(name, name))


def check_model_name(name_or_path: str | None) -> str:
    """The name ``load_model`` will load (None: ``DEFAULT_MODEL``), without loading it; raises ValueError for a
    name that is neither a built-in or packaged model nor a folder."""
    name = name_or_path or DEFAULT_MODEL
    if name not in BUILTIN_MODELS and name not in PACKAGED_MODELS and not Path(name).is_dir():
        raise ValueError(f"unknown model {name!r}: give a built-in model ({', '.join(BUILTIN_MODELS)}), a packaged "
                         f"one ({', '.join(PACKAGED_MODELS)}) or a Hugging Face checkpoint folder")
    return name
