"""The gated delta rule Triton kernels on CUDA match the float32 reference (run on the GPU too) at
bigger odd shapes: fp32 within 1e-5 (IEEE dots, no TF32 anywhere), bf16 within 1e-2.

The same checks as the interpreter tests (tests/unit/gdn_support.py), compiled for the device, up to
the benchmark's shape: one sequence of 16,384 tokens, 32 heads, K = V = 128.
"""

import pytest
import torch

from mini_engine.ops.gated_delta_rule.triton import (
    LaunchConfig,
    chunk_gated_delta_rule_triton,
)
from tests.unit.gdn_support import (
    check_boundary_out,
    check_decode,
    check_decode_continues_prefill,
    check_prefill,
    gdn_inputs,
    offsets,
)

DTYPES = [torch.float32, torch.bfloat16]
LENGTHS = [1, 63, 0, 64, 65, 130, 1000, 4097]
HEADS = dict(hk=4, hv=8, k_dim=128, v_dim=128)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("source", ["none", "tensor", "pool"])
def test_prefill(dtype, source):
    """Varlen prefill, grouped heads, K = V = 128: output, final and boundary states; pool slots in place."""
    check_prefill(lengths=LENGTHS, **HEADS, dtype=dtype, device="cuda", source=source)


@pytest.mark.parametrize("config", [LaunchConfig(16), LaunchConfig(32, num_stages=3), LaunchConfig(64, num_warps=8)],
                         ids=lambda c: f"bv{c.block_v}-w{c.num_warps}-s{c.num_stages}")
def test_prefill_launch_configs(config):
    """Every V tiling the benchmark sweeps computes the same thing (bf16)."""
    check_prefill(lengths=[130, 1000, 7], **HEADS, dtype=torch.bfloat16, device="cuda", source="pool", config=config)


@pytest.mark.parametrize("k_dim, v_dim", [(64, 128), (128, 64), (16, 32)])
def test_prefill_other_head_sizes(k_dim, v_dim):
    """Smaller and unequal head sizes compile and match (fp32)."""
    check_prefill(lengths=[65, 200], hk=2, hv=4, k_dim=k_dim, v_dim=v_dim, dtype=torch.float32, device="cuda",
                  source="tensor")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_benchmark_shape(dtype):
    """One sequence of 16,384 tokens, 32 heads of 128 x 128 (the benchmark's shape), against the fp32 reference."""
    check_prefill(lengths=[16384], hk=32, hv=32, k_dim=128, v_dim=128, dtype=dtype, device="cuda", source="tensor")


def test_prefill_boundary_out():
    """Boundary states land in a caller's flat buffer on the device."""
    check_boundary_out(lengths=[64, 3, 1000], **HEADS, device="cuda")


@pytest.mark.parametrize("config", [None, LaunchConfig(16, num_warps=2), LaunchConfig(64)],
                         ids=lambda c: "default" if c is None else f"bv{c.block_v}-w{c.num_warps}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode(dtype, config):
    """One step at batch 67, 16 q/k and 32 value heads of 128, shuffled strided slots written in place."""
    check_decode(batch=67, hk=16, hv=32, k_dim=128, v_dim=128, dtype=dtype, device="cuda", config=config)


def test_decode_continues_prefill():
    """Prefill of 1000 tokens into a slot, then 5 decode steps, equals one prefill of all 1005 (fp32)."""
    check_decode_continues_prefill(prompt=1000, steps=5, **HEADS, device="cuda")


@pytest.mark.parametrize("dtype, heads", [(torch.float32, {"hk": 2, "hv": 4, "k_dim": 32, "v_dim": 32}),
                                          (torch.bfloat16, {"hk": 16, "hv": 16, "k_dim": 128, "v_dim": 128})],
                         ids=["tiny-fp32", "0.8b-bf16"])
def test_a_sequences_bits_do_not_depend_on_the_batch(dtype, heads):
    """A sequence prefilled alone and inside a batch of 40 (enough sequences to fill every SM: the batch a
    serial engine with reference decode packs, decode items and all) gets the same output and states, bit
    for bit: the walk's launch configuration is the shape's, never the batch's."""
    lengths = [150, 1, 37, 64, *([1] * 30), 200, 3, 65, 128, 1, 9]
    cu = offsets(lengths)
    inputs = gdn_inputs(tokens=sum(lengths), **heads, dtype=dtype, device="cuda")
    initial = 0.1 * torch.randn(len(lengths), heads["hv"], heads["k_dim"], heads["v_dim"], device="cuda",
                                generator=torch.Generator("cuda").manual_seed(5))
    whole = chunk_gated_delta_rule_triton(**inputs, cu_seqlens=cu, initial_state=initial)
    for s in (0, 1, len(lengths) - 2):
        rows = slice(cu[s].item(), cu[s + 1].item())
        alone = chunk_gated_delta_rule_triton(**{name: t[rows] for name, t in inputs.items()},
                                              cu_seqlens=offsets(lengths[s : s + 1]), initial_state=initial[s : s + 1])
        assert torch.equal(alone.output, whole.output[rows]), f"sequence {s}: output"
        assert torch.equal(alone.final_state[0], whole.final_state[s]), f"sequence {s}: final state"
        for mine, theirs in zip(alone.boundary_states[0], whole.boundary_states[s], strict=True):
            assert torch.equal(mine, theirs), f"sequence {s}: a boundary state"
