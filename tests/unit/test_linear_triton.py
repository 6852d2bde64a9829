"""The one-launch batch-invariant projection (``mini_engine.ops.linear.triton``) in the interpreter, at odd
shapes: values within tolerance of ``inv.linear``, a row's bits independent of the batch around it."""

import pytest
import torch
from torch import nn

from mini_engine.model.layers import FusedProjection
from mini_engine.ops.linear.triton import LinearConfig, config_for, linear
from tests.unit.kernel_support import check_fused_projection, check_linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize(("rows", "n_out", "n_in"), [(1, 4, 128), (37, 260, 384), (130, 200, 40), (64, 128, 96)])
def test_linear_matches_the_reference_and_is_batch_invariant(rows, n_out, n_in, dtype):
    check_linear(rows=rows, n_out=n_out, n_in=n_in, dtype=dtype, device="cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_a_fused_projection_gives_each_part_its_own_bits(dtype):
    """Parts of odd widths (a part starting inside a column tile included): the fused gemm's columns are each
    part's own gemm, bit for bit."""
    check_fused_projection(rows=70, widths=(130, 16, 16, 200), n_in=96, dtype=dtype, device="cpu")


def test_a_fused_projection_follows_its_parts():
    """The fused weight is made once and made again after any change to a part: never stale, never a copy per use."""
    a, b = nn.Linear(8, 3, bias=False), nn.Linear(8, 5, bias=False)
    fused = FusedProjection(a, b)
    first = fused.weight()
    assert fused.widths == [3, 5] and torch.equal(first, torch.cat([a.weight, b.weight]))
    assert fused.weight() is first  # unchanged parts: the same tensor
    with torch.no_grad():
        b.weight[0].fill_(7.0)  # an in-place write (a checkpoint load copies in place)
    assert torch.equal(fused.weight()[3], torch.full((8,), 7.0))
    for part in (a, b):
        part.weight.data = part.weight.data.to(torch.float16)  # new tensors (``cast_projections``)
    assert fused.weight().dtype == torch.float16 and not fused.weight().requires_grad


def test_a_fused_projection_in_blocks_alternates_its_two_parts():
    """``block``: rows 0-3 of the first part, rows 0-3 of the second, rows 4-7 of the first, ...; widths that are not
    two equal multiples of the block are refused by name."""
    a, b = nn.Linear(8, 12, bias=False), nn.Linear(8, 12, bias=False)
    fused = FusedProjection(a, b, block=4).weight()
    want = torch.cat([w[i : i + 4] for i in range(0, 12, 4) for w in (a.weight, b.weight)])
    assert torch.equal(fused, want)
    for parts, block in (((a, nn.Linear(8, 8, bias=False)), 4), ((a, b), 5), ((a,), 4)):
        with pytest.raises(ValueError, match="FusedProjection\\(block="):
            FusedProjection(*parts, block=block)


def test_config_depends_on_the_weight_alone():
    """The batch-invariance contract: the tiles are fixed by the weight's dtype and width, never by rows."""
    assert config_for(torch.bfloat16, 1024) == LinearConfig(64, 128, 64)
    assert config_for(torch.float32, 3584) == LinearConfig(64, 64, 32)
    assert config_for(torch.float16, 40).block_k == 16  # 40 = 2 x 16 + 8: the last block masked


def test_leading_dims_and_empty_inputs():
    weight = torch.randn(24, 32)
    x = torch.randn(2, 3, 32)
    assert torch.equal(linear(x, weight), linear(x.reshape(6, 32), weight).reshape(2, 3, 24))
    assert linear(torch.empty(0, 32), weight).shape == (0, 24)


@pytest.mark.parametrize(("x", "weight", "message"), [
    (torch.randn(3, 32), torch.randn(8, 32, dtype=torch.float64), "float32, float16 or bfloat16 weight"),
    (torch.randn(3, 31), torch.randn(8, 32), r"x must be \[\.\.\., 32\]"),
])
def test_bad_inputs_are_named(x, weight, message):
    with pytest.raises(ValueError, match=message):
        linear(x, weight)
