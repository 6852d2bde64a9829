"""The batch-invariant primitives keep their promises on this torch build (the exactness oracle rests on them)."""

import pytest
import torch

from mini_engine.ops import invariant as inv


@pytest.mark.parametrize("n_in,n_out", [(128, 384), (384, 128), (259, 131), (128, 260)])
def test_linear_row_result_independent_of_batch(n_in, n_out):
    """A row's linear output is bit-identical alone, at any position, in batches of any size."""
    gen = torch.Generator().manual_seed(n_in * n_out)
    weight = torch.randn(n_out, n_in, generator=gen)
    row = torch.randn(1, n_in, generator=gen)
    alone = inv.linear(row, weight)[0]
    for rows in (2, 3, 17, 64, 65, 130):
        batch = torch.randn(rows, n_in, generator=gen)
        for pos in {0, rows // 2, rows - 1}:
            batch[pos] = row[0]
            assert torch.equal(inv.linear(batch, weight)[pos], alone), (rows, pos)


def test_linear_matches_matmul_numerically():
    """Tiling changes no value beyond float32 rounding."""
    x, w = torch.randn(100, 64), torch.randn(32, 64)
    torch.testing.assert_close(inv.linear(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
    assert inv.linear(torch.zeros(0, 64), w).shape == (0, 32)


@pytest.mark.parametrize("name", ["sigmoid", "silu", "softplus"])
def test_activations_position_invariant(name):
    """Each element's activation is the same whether it lands in a vector lane or the scalar tail."""
    fn = getattr(inv, name)
    x = torch.cat([torch.randn(4099) * 4, torch.tensor([-30.0, -20.0, 0.0, 19.9, 20.0, 20.1, 40.0])])
    whole = fn(x)
    pieces = torch.cat([fn(x[i : i + 7]) for i in range(0, x.numel(), 7)])
    assert torch.equal(whole, pieces)


def test_activations_match_torch():
    """The composed activations equal torch's to float32 rounding."""
    x = torch.randn(10_000) * 6
    torch.testing.assert_close(inv.sigmoid(x), torch.sigmoid(x))
    torch.testing.assert_close(inv.silu(x), torch.nn.functional.silu(x))
    torch.testing.assert_close(inv.softplus(x), torch.nn.functional.softplus(x))


def test_bmm_invariant_to_batch_count():
    """A fixed-shape matrix product gives the same bits in any batch, at any index."""
    gen = torch.Generator().manual_seed(3)
    a0, b0 = torch.randn(64, 32, generator=gen), torch.randn(32, 64, generator=gen)
    alone = inv.bmm(a0[None], b0[None])[0]
    for count in (2, 7, 40):
        a, b = torch.randn(count, 64, 32, generator=gen), torch.randn(count, 32, 64, generator=gen)
        a[count - 1], b[count - 1] = a0, b0
        assert torch.equal(inv.bmm(a, b)[count - 1], alone)


def test_norms():
    """rms_norm and l2_normalize compute the documented formulas."""
    x = torch.randn(5, 16)
    torch.testing.assert_close(inv.rms_norm(x, 1e-6), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(inv.l2_normalize(x).norm(dim=-1), torch.ones(5), rtol=1e-5, atol=1e-5)
