"""The Qwen3.5-style hybrid model: config, byte tokenizer, the built-in and packaged tiny models, HF checkpoint loader."""

from mini_engine.model.builtin import BUILTIN_MODELS, DEFAULT_MODEL, PACKAGED_MODELS, build_builtin
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
    "load_model",
    "load_pretrained",
    "save_pretrained",
]


def load_model(name_or_path: str | None = None) -> HybridModel:
    """A model by name (default ``DEFAULT_MODEL``: the packaged ``probe-tiny``; ``tiny-random`` is
    built from a seed) or a checkpoint folder by path."""
    name = name_or_path or DEFAULT_MODEL
    if name in BUILTIN_MODELS:
        return build_builtin(name)
    if name in PACKAGED_MODELS:
        return load_pretrained(PACKAGED_MODELS[name])
    return load_pretrained(name)
