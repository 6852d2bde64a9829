"""The chunked gated delta rule is the recurrence: outputs, final and boundary states, packed or not."""

from itertools import accumulate

import pytest
import torch

from mini_engine.ops.gated_delta_rule import CHUNK, chunk_gated_delta_rule, recurrent_gated_delta_rule
from mini_engine.ops.invariant import l2_normalize

HK, HV, K, V = 2, 4, 16, 8


def make_inputs(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    return dict(
        q=l2_normalize(torch.randn(total, HK, K, generator=gen)),
        k=l2_normalize(torch.randn(total, HK, K, generator=gen)),
        v=torch.randn(total, HV, V, generator=gen),
        g=-torch.rand(total, HV, generator=gen) * 0.3,
        beta=torch.rand(total, HV, generator=gen),
        cu_seqlens=torch.tensor([0, *accumulate(lengths)]),
        initial_state=torch.randn(len(lengths), HV, K, V, generator=gen) * 0.1,
    )


@pytest.mark.parametrize("length", [1, 63, 64, 65, 130, 500])
def test_chunked_matches_recurrent(length):
    """Output and final state agree with the token-by-token recurrence."""
    inputs = make_inputs([length], seed=length)
    chunked, recurrent = chunk_gated_delta_rule(**inputs), recurrent_gated_delta_rule(**inputs)
    torch.testing.assert_close(chunked.output, recurrent.output, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(chunked.final_state, recurrent.final_state, rtol=1e-4, atol=1e-5)
    assert chunked.boundary_states[0].shape[0] == length // CHUNK
    torch.testing.assert_close(chunked.boundary_states[0], recurrent.boundary_states[0], rtol=1e-4, atol=1e-5)


def test_varlen_packed_matches_per_sequence_loop():
    """A packed batch computes each sequence exactly as it is computed alone (bit-identical)."""
    lengths = [1, 63, 64, 65, 130, 500, 7]
    packed = chunk_gated_delta_rule(**make_inputs(lengths, seed=9))
    full = make_inputs(lengths, seed=9)
    for s, (lo, hi) in enumerate(zip(full["cu_seqlens"][:-1].tolist(), full["cu_seqlens"][1:].tolist())):
        alone = chunk_gated_delta_rule(
            q=full["q"][lo:hi], k=full["k"][lo:hi], v=full["v"][lo:hi], g=full["g"][lo:hi],
            beta=full["beta"][lo:hi], cu_seqlens=torch.tensor([0, hi - lo]),
            initial_state=full["initial_state"][s : s + 1])
        assert torch.equal(alone.output, packed.output[lo:hi])
        assert torch.equal(alone.final_state[0], packed.final_state[s])
        assert torch.equal(alone.boundary_states[0], packed.boundary_states[s])


def test_recurrent_varlen_matches_chunked_varlen():
    """The recurrent form handles packed batches too."""
    inputs = make_inputs([3, 70, 64], seed=4)
    torch.testing.assert_close(recurrent_gated_delta_rule(**inputs).output,
                               chunk_gated_delta_rule(**inputs).output, rtol=1e-4, atol=1e-5)


def test_no_initial_state_means_zeros():
    """initial_state=None is the zero state."""
    inputs = make_inputs([40], seed=2)
    with_zeros = chunk_gated_delta_rule(**{**inputs, "initial_state": torch.zeros(1, HV, K, V)})
    assert torch.equal(chunk_gated_delta_rule(**{**inputs, "initial_state": None}).output, with_zeros.output)


def test_partial_chunk_rows_do_not_depend_on_later_rows():
    """A row's output is bit-identical whether its chunk is complete or still filling (chunk-exact decode)."""
    inputs = make_inputs([100], seed=5)
    whole = chunk_gated_delta_rule(**inputs).output
    prefix = {n: (t[:80] if n not in ("cu_seqlens", "initial_state") else t) for n, t in inputs.items()}
    prefix["cu_seqlens"] = torch.tensor([0, 80])
    assert torch.equal(chunk_gated_delta_rule(**prefix).output, whole[:80])


def test_bad_shapes_rejected():
    """Mismatched inputs get an error naming the tensor."""
    inputs = make_inputs([10])
    with pytest.raises(ValueError, match="beta"):
        chunk_gated_delta_rule(**{**inputs, "beta": inputs["beta"][:, :1]})
    with pytest.raises(ValueError, match="cu_seqlens"):
        chunk_gated_delta_rule(**{**inputs, "cu_seqlens": torch.tensor([0, 9])})
