"""ModelConfig validates itself with errors that name the field; the byte tokenizer round-trips."""

import dataclasses

import pytest
import torch

from mini_engine.model import ByteTokenizer, HybridModel, ModelConfig
from mini_engine.model.builtin import QWEN35_08B, builtin_config
from mini_engine.model.config import FULL, LINEAR


def tiny(**changes):
    return dataclasses.replace(builtin_config("tiny-random"), **changes)


@pytest.mark.parametrize("changes,field", [
    ({"hidden_size": 0}, "hidden_size"),
    ({"layer_types": ("linear_attention", "mamba")}, "layer_types"),
    ({"layer_types": ()}, "layer_types"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads"),
    ({"partial_rotary_factor": 0.0}, "partial_rotary_factor"),
    ({"eos_token_id": (9999,)}, "eos_token_id"),
    ({"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim"),
])
def test_invalid_config_names_the_field(changes, field):
    """Each invalid value raises a ValueError that names the field."""
    with pytest.raises(ValueError, match=field):
        tiny(**changes)


def test_hf_round_trip():
    """to_hf() then from_hf() gives back the same config; the 3:1 pattern is derived when layer_types is absent."""
    config = builtin_config("tiny-random")
    again = ModelConfig.from_hf(config.to_hf(), name=config.name)
    assert again == config
    raw = config.to_hf()
    del raw["layer_types"]
    raw["num_hidden_layers"] = 8
    assert ModelConfig.from_hf(raw).layer_types == ("linear_attention",) * 3 + ("full_attention",) + \
        ("linear_attention",) * 3 + ("full_attention",)


def test_hf_config_missing_field():
    """A config.json without a required field names it."""
    raw = builtin_config("tiny-random").to_hf()
    del raw["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf(raw)


def test_multimodal_wrapper_config_reads_text_config():
    """A Qwen3.5 ConditionalGeneration config nests the text config; it is read from there."""
    inner = builtin_config("tiny-random").to_hf()
    assert ModelConfig.from_hf({"text_config": inner, "tie_word_embeddings": False}).hidden_size == 128


def test_tokenizer_round_trip_and_specials():
    """UTF-8 text and special tokens round-trip; specials map to their own ids."""
    tok = ByteTokenizer()
    text = "héllo <|im_start|>user\nwörld<|im_end|>\n<|media|>"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.special_ids["<|im_start|>"] in ids and tok.media_token_id in ids
    assert tok.encode("<|im_end|>", allow_special=False) == list(b"<|im_end|>")
    assert tok.decode(ids, skip_special=True) == "héllo user\nwörld\n"
    assert max(ids) < tok.vocab_size == 260


def test_chat_template():
    """ChatML with an assistant header; bad roles and contents are rejected by index."""
    tok = ByteTokenizer()
    text = tok.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match=r"messages\[1\].role"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    with pytest.raises(ValueError, match="at least one"):
        tok.apply_chat_template([])


def test_decode_rejects_out_of_vocab():
    """Unknown ids are an error, not silent garbage."""
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ByteTokenizer().decode([65, 999])


def test_decode_can_render_ids_past_the_vocabulary():
    """A tokenizer made for a model with a larger vocabulary renders those ids as U+FFFD; negatives still raise."""
    tok = ByteTokenizer(unknown="replace")
    assert tok.decode([65, 4000, 66, 256]) == "A\ufffdB<|endoftext|>"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="unknown must be one of"):
        ByteTokenizer(unknown="ignore")


def test_the_production_sized_builtin_has_qwen35_08bs_shape():
    """qwen3.5-0.8b-shaped-random: the issue's shape (hidden 1024, 24 layers 3:1, 16 linear key/value heads of 128,
    8 query / 2 KV heads of 256, intermediate 3584, tied embedding), 0.5 B parameters over the byte vocabulary and
    19 MB of recurrent state a slot; counted on the meta device (nothing allocated)."""
    config = builtin_config(QWEN35_08B)
    assert (config.hidden_size, config.intermediate_size, config.layer_types) == (1024, 3584, (LINEAR,) * 3 + (FULL,)
                                                                                  + ((LINEAR,) * 3 + (FULL,)) * 5)
    assert (config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
            config.linear_value_head_dim) == (16, 16, 128, 128)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (8, 2, 256)
    assert config.tie_word_embeddings and config.name == QWEN35_08B
    with torch.device("meta"):
        model = HybridModel(config)
    assert 0.49e9 < sum(p.numel() for p in model.parameters()) < 0.51e9
    rec = model.new_state().rec  # the slot's recurrent state: 18 linear layers of 16 [128 x 128] float32 states
    assert rec.numel() * rec.element_size() == 18_874_368
