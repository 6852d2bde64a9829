"""Exactness, the oracle's foundation (DESIGN.md §3): hits, decode steps and batch company change no bit."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_engine.model import SequenceState


def prompt(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


def test_continuation_from_boundary_snapshot_is_bit_identical(tiny_model):
    """Resuming from the saved state at each 64-multiple (conv + recurrent + KV) reproduces every logit."""
    ids = prompt(300, 0)
    whole = tiny_model([ids], [tiny_model.new_state()], all_logits=True)[0]
    assert [s.position for s in whole.snapshots] == [64, 128, 192, 256]
    for snap in whole.snapshots:
        resumed = SequenceState.from_snapshot(tiny_model.config, snap, whole.state.keys, whole.state.values)
        rest = tiny_model([ids[snap.position:]], [resumed], all_logits=True)[0]
        assert torch.equal(rest.logits, whole.logits[snap.position:]), snap.position
        assert torch.equal(rest.state.rec, whole.state.rec)
        assert torch.equal(rest.state.conv, whole.state.conv)


def test_last_snapshot_only_is_the_last_of_all(tiny_model):
    """``snapshots="last"`` (the engine's track snapshot) keeps the last boundary's state, bit for bit, and
    changes nothing else; a forward that crosses no boundary has none either way."""
    packed = [prompt(300, 3), prompt(70, 4), prompt(20, 5)]
    starts = [tiny_model([p[:10]], [tiny_model.new_state()])[0].state for p in packed]
    every = tiny_model([p[10:] for p in packed], starts, all_logits=True)  # (a forward leaves its states as they were)
    last = tiny_model([p[10:] for p in packed], starts, all_logits=True, snapshots="last")
    assert [[s.position for s in o.snapshots] for o in every] == [[64, 128, 192, 256], [64], []]
    for a, b in zip(every, last):
        assert [s.position for s in b.snapshots] == [s.position for s in a.snapshots][-1:]
        for x, y in zip(a.snapshots[-1:], b.snapshots):
            assert torch.equal(x.rec, y.rec) and torch.equal(x.conv, y.conv)
        assert torch.equal(a.logits, b.logits) and torch.equal(a.state.rec, b.state.rec)
        assert torch.equal(a.state.conv, b.state.conv) and torch.equal(a.state.keys, b.state.keys)
    with pytest.raises(ValueError, match="snapshots must be one of"):
        tiny_model([packed[0]], [tiny_model.new_state()], snapshots="first")


def test_snapshots_equal_whichever_way_the_prefix_was_computed(tiny_model):
    """A boundary snapshot is the same bits from one prefill or from 1-token decode steps."""
    ids = prompt(130, 1)
    whole = tiny_model([ids], [tiny_model.new_state()])[0]
    state, stepped = tiny_model.new_state(), []
    for t in range(130):
        out = tiny_model([ids[t : t + 1]], [state])[0]
        state, stepped = out.state, stepped + out.snapshots
    assert [s.position for s in stepped] == [64, 128]
    for a, b in zip(whole.snapshots, stepped):
        assert torch.equal(a.rec, b.rec) and torch.equal(a.conv, b.conv)


def test_decode_steps_equal_prefill_rows(tiny_model):
    """Greedy decoding one token at a time computes the same logits as the prefill rows."""
    ids = prompt(150, 2)
    whole = tiny_model([ids], [tiny_model.new_state()], all_logits=True)[0]
    state = tiny_model([ids[:100]], [tiny_model.new_state()])[0].state
    for t in range(100, 150):
        out = tiny_model([ids[t : t + 1]], [state])[0]
        assert torch.equal(out.logits[0], whole.logits[t]), t
        state = out.state


def test_row_invariant_inside_batches_of_other_rows(tiny_model):
    """One sequence's logits are bit-identical alone and inside batches of 2..8 other rows of other lengths."""
    target = prompt(97, 3)
    alone = tiny_model([target], [tiny_model.new_state()], all_logits=True)[0].logits
    for others in range(2, 9):
        company = [prompt(1 + 37 * j % 200, 10 + j) for j in range(others)]
        seqs = company[: others // 2] + [target] + company[others // 2:]
        outs = tiny_model(seqs, [tiny_model.new_state() for _ in seqs], all_logits=True)
        assert torch.equal(outs[others // 2].logits, alone), others


def test_decode_row_invariant_next_to_prefills(tiny_model):
    """A decode step gives the same bits when co-batched with prefills of other sequences at other positions."""
    ids = prompt(70, 4)
    state = tiny_model([ids[:69]], [tiny_model.new_state()])[0].state
    alone = tiny_model([ids[69:]], [state])[0].logits
    other = tiny_model([prompt(50, 5)], [tiny_model.new_state()])[0].state
    mixed = tiny_model([prompt(130, 6), ids[69:], prompt(3, 7)], [tiny_model.new_state(), state, other])
    assert torch.equal(mixed[1].logits, alone)


@settings(max_examples=12, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=90), min_size=1, max_size=4), seed=st.integers(0, 10**6))
def test_any_chunking_of_a_prompt_is_exact(tiny_model, cuts, seed):
    """However a prompt is cut into consecutive forwards, the final logits and state are the same bits."""
    ids = prompt(sum(cuts) + 5, seed)
    whole = tiny_model([ids], [tiny_model.new_state()])[0]
    state, pos = tiny_model.new_state(), 0
    for n in [*cuts, 5]:
        out = tiny_model([ids[pos : pos + n]], [state])[0]
        state, pos = out.state, pos + n
    assert torch.equal(out.logits, whole.logits)
    assert torch.equal(state.rec, whole.state.rec) and torch.equal(state.pending, whole.state.pending)
    assert torch.equal(state.keys, whole.state.keys)


def test_forward_rejects_bad_tokens_and_inconsistent_state(tiny_model):
    """Empty or out-of-vocabulary tokens and a state whose tensors disagree with its length are errors."""
    with pytest.raises(ValueError, match="non-empty 1-D ids"):
        tiny_model([torch.tensor([], dtype=torch.long)], [tiny_model.new_state()])
    with pytest.raises(ValueError, match="non-empty 1-D ids"):
        tiny_model([torch.tensor([1, 9999])], [tiny_model.new_state()])
    state = tiny_model([prompt(10, 8)], [tiny_model.new_state()])[0].state
    state.length = 11
    with pytest.raises(ValueError, match="pending rows"):
        tiny_model([prompt(1, 9)], [state])
