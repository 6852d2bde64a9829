"""The Qwen3.5-style hybrid model: config, byte tokenizer, built-in tiny default, HF checkpoint loader."""

from mini_engine.model.builtin import BUILTIN_MODELS, build_builtin
from mini_engine.model.config import ModelConfig
from mini_engine.model.hybrid import HybridModel, StepOutput
from mini_engine.model.loader import CheckpointError, load_pretrained, save_pretrained
from mini_engine.model.state import SequenceState, Snapshot
from mini_engine.model.tokenizer import ByteTokenizer

__all__ = [
    "BUILTIN_MODELS",
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
    """A built-in model by name (default ``tiny-random``) or a checkpoint folder by path."""
    if name_or_path is None or name_or_path in BUILTIN_MODELS:
        return build_builtin(name_or_path or "tiny-random")
    return load_pretrained(name_or_path)
