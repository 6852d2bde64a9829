"""Hugging Face checkpoints of the Qwen3.5 family: ``config.json`` + ``*.safetensors``.

Accepted tensor names: ``model.…`` (``Qwen3_5ForCausalLM``) and ``model.language_model.…`` (the
multimodal ``Qwen3_5ForConditionalGeneration``; its vision tower and MTP head are ignored). A
checkpoint that lacks a tensor or holds one of the wrong shape fails with one error listing every
such tensor, so a user fixes the checkpoint once.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mini_engine.model.config import ModelConfig
from mini_engine.model.hybrid import HybridModel

__all__ = ["CheckpointError", "load_pretrained", "save_pretrained"]

_PREFIXES = ("model.language_model.", "model.")
_IGNORED = ("mtp.", "model.visual.", "visual.")
_OPTIONAL = ("media_projector.",)  # ours, not Qwen3.5's: a checkpoint without it keeps the seeded one


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names every offending file or tensor."""


def _canonical(name: str) -> str | None:
    if name.startswith(_IGNORED):
        return None
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return "model." + name[len(prefix):]
    return name


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                name = _canonical(key)
                if name is not None:
                    tensors[name] = handle.get_tensor(key)
    return tensors


def load_pretrained(folder: str | Path, *, dtype: torch.dtype = torch.float32) -> HybridModel:
    """Load a checkpoint folder into a ``HybridModel`` (float32 by default, the exact configuration)."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no config.json (is this a Hugging Face checkpoint folder?)")
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config_path}: not valid JSON ({err})") from None
    try:
        config = ModelConfig.from_hf(raw, name=folder.name)
    except ValueError as err:
        raise CheckpointError(f"{config_path}: {err}") from None
    model = HybridModel(config)
    tensors = _read_tensors(folder)
    expected = model.state_dict()
    missing = sorted(n for n in expected if n not in tensors and not n.startswith(_OPTIONAL))
    misshapen = sorted(f"{n}: checkpoint {tuple(tensors[n].shape)}, expected {tuple(t.shape)}"
                       for n, t in expected.items() if n in tensors and tensors[n].shape != t.shape)
    if missing or misshapen:
        lines = [f"missing tensor {n}" for n in missing] + [f"wrong shape {m}" for m in misshapen]
        raise CheckpointError(f"{folder}: cannot load {len(lines)} tensor(s):\n  " + "\n  ".join(lines))
    model.load_state_dict({n: tensors.get(n, t) for n, t in expected.items()}, strict=True)
    return model.to(dtype).eval()


def save_pretrained(model: HybridModel, folder: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` that both this loader and ``transformers`` read."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")
    state = {n: t.detach().contiguous() for n, t in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
