"""The gated delta rule Triton kernels on CUDA match the float32 reference (run on the GPU too) at
bigger odd shapes: fp32 within 1e-5 (IEEE dots, no TF32 anywhere), bf16 within 1e-2.

The same checks as the interpreter tests (tests/unit/gdn_support.py), compiled for the device, up to
the benchmark's shape: one sequence of 16,384 tokens, 32 heads, K = V = 128.
"""

import pytest
import torch

from mini_engine.ops.gated_delta_rule.triton import LaunchConfig
from tests.unit.gdn_support import (
    check_boundary_out,
    check_decode,
    check_decode_continues_prefill,
    check_prefill,
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
