"""``HybridModel.forward(kernels="triton")``: the conv, gated delta rule and attention through the Triton
kernels (in the interpreter here, on two-layer models: the interpreter costs ~0.5 s a layer and forward)
give the reference's values to rounding, and keep the exactness contract on their own: a forward split at
a 64-boundary, or a sequence alone instead of packed, gives the same bits."""

import dataclasses

import pytest
import torch

from mini_engine.model import HybridModel
from mini_engine.model.builtin import builtin_config, init_weights
from mini_engine.model.config import FULL, LINEAR


SHAPES = {
    "tiny": {},
    # the head sizes of Qwen3.5-0.8B (linear K = V = 128, attention head_dim 256 with GQA), few heads
    "0.8b-heads": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                       linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128,
                       linear_value_head_dim=128),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def model(request):
    config = dataclasses.replace(builtin_config("tiny-random"), layer_types=(LINEAR, FULL), **SHAPES[request.param])
    return init_weights(HybridModel(config))


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (70,), generator=gen), torch.randint(0, 256, (13,), generator=gen)]


@pytest.fixture(scope="module")
def packed(model, prompts):
    return {kernels: model(prompts, [model.new_state() for _ in prompts], all_logits=True, kernels=kernels)
            for kernels in ("reference", "triton")}


def test_triton_forward_matches_the_reference(packed):
    for ref, got in zip(packed["reference"], packed["triton"]):
        assert torch.allclose(got.logits, ref.logits, rtol=1e-5, atol=1e-5 * float(ref.logits.abs().max()))
        for name in ("conv", "rec", "pending", "keys", "values"):
            want, have = getattr(ref.state, name), getattr(got.state, name)
            assert have.shape == want.shape, name
            assert torch.allclose(have, want, rtol=1e-5, atol=1e-5 * max(1.0, float(want.abs().max()))), name
        assert [s.position for s in got.snapshots] == [s.position for s in ref.snapshots]
    assert [len(out.snapshots) for out in packed["triton"]] == [1, 0]


def test_triton_forward_is_exact_across_a_split_and_alone(model, prompts, packed):
    whole = packed["triton"][0]
    first = model([prompts[0][:64]], [model.new_state()], all_logits=True, kernels="triton")[0]
    rest = model([prompts[0][64:]], [first.state], all_logits=True, kernels="triton")[0]
    assert torch.equal(torch.cat([first.logits, rest.logits]), whole.logits)
    assert torch.equal(first.snapshots[0].rec, whole.snapshots[0].rec)
    for name in ("conv", "rec", "pending", "keys", "values"):
        assert torch.equal(getattr(rest.state, name), getattr(whole.state, name)), name
    alone = model([prompts[1]], [model.new_state()], all_logits=True, kernels="triton")[0]
    assert torch.equal(alone.logits, packed["triton"][1].logits)


def test_forward_names_unknown_kernels(model, prompts):
    with pytest.raises(ValueError, match="kernels must be one of"):
        model(prompts[:1], [model.new_state()], kernels="fast")
