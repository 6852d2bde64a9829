"""Parity with transformers' Qwen3_5ForCausalLM: the model's specification (DESIGN.md §3)."""

import sys

sys.modules.setdefault("fla", None)  # fla's GPU kernels would be bound by transformers and break the CPU model

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

from mini_engine.model import load_pretrained  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB = 300


def random_hf_model(folder, *, tied: bool, seed: int):
    """A small random HF model with every weight perturbed (norms included), well-conditioned (gain 0.7)."""
    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=1024, tie_word_embeddings=tied)
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "linear_attn.norm" in name else 0.0))
            elif "A_log" in name:
                p.copy_(torch.empty_like(p).uniform_(0.0, 2.7))
            elif "dt_bias" in name:
                p.copy_(torch.randn_like(p) * 0.5)
            elif "embed" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.7 * p.shape[-1] ** -0.5)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    hf = random_hf_model(folder, tied=request.param, seed=11)
    return hf, load_pretrained(folder)


@pytest.mark.parametrize("length", [1, 63, 64, 65, 200])
def test_logits_match(pair, length):
    """Logits at every position agree with transformers to 5e-6 of the logits' scale in float32.

    The bound is relative because float32 error grows with the logits: on the tied model (logits up to
    ~72) transformers' own float32 differs from its float64 by 1.5e-4, twice as much as ours does."""
    hf, ours = pair
    ids = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    got = ours([ids], [ours.new_state()], all_logits=True)[0].logits
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 5e-6 * expected.abs().max().item()


def test_greedy_generation_matches(pair):
    """32 greedy tokens are identical to transformers' generate (which decodes with its recurrent kernel)."""
    hf, ours = pair
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(5))
    expected = hf.generate(ids[None], max_new_tokens=32, min_new_tokens=32, do_sample=False)[0, 20:].tolist()
    state, new, got = ours.new_state(), ids, []
    for _ in range(32):
        step = ours([new], [state])[0]
        state, token = step.state, int(step.logits[-1].argmax())
        got.append(token)
        new = torch.tensor([token])
    assert got == expected
