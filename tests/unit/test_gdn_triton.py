"""The gated delta rule Triton kernels match the reference in the interpreter (fp32 1e-5, fp16 1e-2).

Odd varlen batches (lengths 0, 1, 63, 64, 65, 130), grouped value heads, small heads; initial states
from a tensor, from strided slot-pool rows (written back in place) or zero. bf16 is not tested here:
the interpreter computes it wrongly (tests/gpu covers it on CUDA).
"""

import pytest
import torch

from mini_engine.ops.gated_delta_rule.triton import (
    LaunchConfig,
    chunk_gated_delta_rule_triton,
)
from mini_engine.ops.gated_delta_rule.triton_decode import fused_recurrent_gated_delta_rule_triton
from tests.unit.gdn_support import (
    check_boundary_out,
    check_decode,
    check_decode_continues_prefill,
    check_prefill,
    gdn_inputs,
    offsets,
)

LENGTHS = [1, 63, 0, 64, 65, 130]
GROUPED = dict(hk=1, hv=2, k_dim=16, v_dim=32)


@pytest.mark.parametrize("source", ["none", "tensor", "pool"])
def test_prefill_fp32(source):
    """Output, final and x64 boundary states within 1e-5 of the reference, whatever the initial state's source."""
    check_prefill(lengths=LENGTHS, **GROUPED, dtype=torch.float32, device="cpu", source=source)


def test_prefill_fp16_from_pool():
    """fp16 inputs: within 1e-2 of the float32 reference; final states land in their slots."""
    check_prefill(lengths=LENGTHS, **GROUPED, dtype=torch.float16, device="cpu", source="pool")


def test_prefill_tiled_values_equal_heads():
    """V split over programs (block_v=16 of V=32), Hk = Hv, K > V: still the reference."""
    check_prefill(lengths=[129, 5], hk=2, hv=2, k_dim=32, v_dim=32, dtype=torch.float32, device="cpu",
                  source="pool", config=LaunchConfig(block_v=16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_prefill_chunks_ending_inside_blocks(dtype):
    """Chunks ending inside the 2nd, 3rd or 4th 16-row block (grouped heads, K != V): still the reference."""
    check_prefill(lengths=[17, 33, 50, 104], hk=1, hv=2, k_dim=32, v_dim=16, dtype=dtype, device="cpu", source="tensor")


def test_prefill_boundary_out():
    """A caller's flat buffer receives the boundary states; the returned list views it."""
    check_boundary_out(lengths=[64, 3, 130], **GROUPED, device="cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_decode(dtype):
    """One step at batch 5 in shuffled strided slots, V in two tiles: output and state vs the recurrence."""
    check_decode(batch=5, hk=2, hv=4, k_dim=16, v_dim=32, dtype=dtype, device="cpu", config=LaunchConfig(block_v=16))


def test_decode_continues_prefill():
    """Prefill of 65 tokens into a slot, then 3 decode steps, equals one prefill of all 68."""
    check_decode_continues_prefill(prompt=65, steps=3, **GROUPED, device="cpu")


def test_bad_arguments_rejected():
    """Pools of the wrong shape, a pool and a tensor at once, and unsupported head sizes get named errors."""
    inputs = gdn_inputs(tokens=4, hk=1, hv=2, k_dim=16, v_dim=16, dtype=torch.float32, device="cpu")
    pool, rows = torch.zeros(3, 2, 16, 16), torch.tensor([0], dtype=torch.int32)
    with pytest.raises(ValueError, match="not both"):
        chunk_gated_delta_rule_triton(**inputs, cu_seqlens=offsets([4]), initial_state=pool[:1], state_pool=pool,
                                      state_indices=rows)
    with pytest.raises(ValueError, match="state_pool"):
        chunk_gated_delta_rule_triton(**inputs, cu_seqlens=offsets([4]), state_pool=pool.transpose(2, 3).contiguous()
                                      .transpose(2, 3), state_indices=rows)
    with pytest.raises(ValueError, match="state_indices"):
        fused_recurrent_gated_delta_rule_triton(**{n: t[:2] for n, t in inputs.items()}, state_pool=pool,
                                                state_indices=rows)
    odd = gdn_inputs(tokens=4, hk=1, hv=1, k_dim=24, v_dim=16, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="head size K"):
        chunk_gated_delta_rule_triton(**odd, cu_seqlens=offsets([4]))
    with pytest.raises(ValueError, match="block_v"):
        LaunchConfig(block_v=48)


def test_the_walk_configuration_is_chosen_by_the_shape_not_the_batch(monkeypatch):
    """The walk's launch configuration is asked for with the sequence's shape only: one sequence and a pack of 41
    ask alike (on a GPU the choice changes the dots' shapes, so a choice by the batch could change a bit)."""
    from mini_engine.ops.gated_delta_rule import triton as gdn_triton

    asked = []
    choose = gdn_triton._default_walk_config
    monkeypatch.setattr(gdn_triton, "_default_walk_config", lambda *args: asked.append(args) or choose(*args))
    for lengths in ([3], [3, *([1] * 40)]):
        inputs = gdn_inputs(tokens=sum(lengths), **GROUPED, dtype=torch.float32, device="cpu")
        chunk_gated_delta_rule_triton(**inputs, cu_seqlens=offsets(lengths))
    assert len(asked) == 2 and asked[0] == asked[1]
