"""Checkpoint loading: round trips, HF prefixes, and clear errors for broken checkpoints."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mini_engine.model import CheckpointError, build_builtin, load_model, load_pretrained, save_pretrained


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    return save_pretrained(build_builtin(), folder)


def test_round_trip_is_exact(saved, tiny_model):
    """A saved and reloaded model computes the same logits bit for bit."""
    loaded = load_pretrained(saved)
    ids = torch.arange(40) % 256
    a = tiny_model([ids], [tiny_model.new_state()])[0].logits
    b = loaded([ids], [loaded.new_state()])[0].logits
    assert torch.equal(a, b)
    assert load_model(str(saved)).config.hidden_size == 128


def rewrite(saved, tmp_path, edit):
    tensors = load_file(str(saved / "model.safetensors"))
    edit(tensors)
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_language_model_prefix_is_accepted(saved, tmp_path):
    """Multimodal checkpoints name text tensors model.language_model.*; vision and MTP tensors are ignored."""
    def edit(t):
        for name in [n for n in t if n.startswith("model.")]:
            t["model.language_model." + name[len("model."):]] = t.pop(name)
        t["model.visual.blocks.0.weight"] = torch.zeros(3)
        t["mtp.fc.weight"] = torch.zeros(2)
    assert load_pretrained(rewrite(saved, tmp_path, edit)).config.vocab_size == 260


def test_missing_and_misshapen_tensors_are_all_named(saved, tmp_path):
    """One error lists every missing tensor and every wrong shape, with the expected shape."""
    def edit(t):
        del t["model.layers.3.self_attn.k_norm.weight"]
        t["model.layers.0.linear_attn.A_log"] = torch.zeros(5)
    with pytest.raises(CheckpointError) as err:
        load_pretrained(rewrite(saved, tmp_path, edit))
    message = str(err.value)
    assert "missing tensor model.layers.3.self_attn.k_norm.weight" in message
    assert "wrong shape model.layers.0.linear_attn.A_log: checkpoint (5,), expected (4,)" in message


def test_broken_folders(tmp_path, saved):
    """No config, bad JSON, a config lacking fields, or no weights: each says what is wrong."""
    with pytest.raises(CheckpointError, match="no config.json"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_pretrained(tmp_path)
    raw = json.loads((saved / "config.json").read_text())
    del raw["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="vocab_size"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_pretrained(tmp_path)


def test_unknown_builtin_name():
    """An unknown name that is not a folder fails naming the models there are; a folder without a checkpoint
    fails with the folder error."""
    with pytest.raises(ValueError, match="unknown model 'no-such-model': give a built-in model \\(tiny-random, "
                                         "qwen3.5-0.8b-shaped-random\\), a packaged one \\(probe-tiny\\)"):
        load_model("no-such-model")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(".")
