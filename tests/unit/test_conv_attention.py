"""Causal conv1d and prefix attention references: right values, and prefill == step-by-step, bit for bit."""

from itertools import accumulate

import pytest
import torch
import torch.nn.functional as F

from mini_engine.ops.attention import attention_with_prefix
from mini_engine.ops.causal_conv1d import causal_conv1d, causal_conv1d_update


def test_conv_matches_torch_conv1d():
    """Prefill equals torch's depthwise conv1d with left zero padding, then SiLU."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(37, 6, generator=gen), torch.randn(6, 4, generator=gen)
    out = causal_conv1d(x=x, weight=w, cu_seqlens=torch.tensor([0, 37])).output
    ref = F.silu(F.conv1d(x.t()[None], w[:, None, :], padding=3, groups=6)[0, :, :37].t())
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_conv_update_loop_equals_prefill_and_states_chain():
    """Single-step updates reproduce prefill exactly, and the final state continues a split sequence."""
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(20, 5, generator=gen), torch.randn(5, 4, generator=gen)
    init = torch.randn(1, 5, 3, generator=gen)
    whole = causal_conv1d(x=x, weight=w, cu_seqlens=torch.tensor([0, 20]), initial_state=init)
    state, rows = init, []
    for t in range(20):
        step = causal_conv1d_update(x=x[t : t + 1], weight=w, state=state)
        rows.append(step.output)
        state = step.final_state
    assert torch.equal(torch.cat(rows), whole.output)
    assert torch.equal(state, whole.final_state)
    first = causal_conv1d(x=x[:9], weight=w, cu_seqlens=torch.tensor([0, 9]), initial_state=init)
    second = causal_conv1d(x=x[9:], weight=w, cu_seqlens=torch.tensor([0, 11]), initial_state=first.final_state)
    assert torch.equal(torch.cat([first.output, second.output]), whole.output)


def test_conv_packed_equals_alone():
    """Sequences in a packed batch do not see each other."""
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(30, 4, generator=gen), torch.randn(4, 4, generator=gen)
    packed = causal_conv1d(x=x, weight=w, cu_seqlens=torch.tensor([0, 1, 13, 30]))
    alone = causal_conv1d(x=x[13:], weight=w, cu_seqlens=torch.tensor([0, 17]))
    assert torch.equal(packed.output[13:], alone.output)


def naive_attention(q, k, v):
    """Softmax attention of the last len(q) positions over all keys, causal, GQA by repeat."""
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk.double()) * q.shape[-1] ** -0.5
    q_pos = torch.arange(k.shape[0] - q.shape[0], k.shape[0])
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv.double()).float()


LENGTHS = [(1, 1), (5, 70), (65, 65), (1, 200), (130, 131), (64, 128)]


def packed(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qs = [torch.randn(a, 4, 16, generator=gen) for a, _ in lengths]
    ks = [torch.randn(b, 2, 16, generator=gen) for _, b in lengths]
    vs = [torch.randn(b, 2, 16, generator=gen) for _, b in lengths]
    cu_q = torch.tensor([0, *accumulate(a for a, _ in lengths)])
    cu_k = torch.tensor([0, *accumulate(b for _, b in lengths)])
    return qs, ks, vs, cu_q, cu_k


def test_attention_matches_softmax_reference():
    """Varlen prefix attention equals plain causal softmax attention per sequence."""
    qs, ks, vs, cu_q, cu_k = packed(LENGTHS)
    out = attention_with_prefix(q=torch.cat(qs), k=torch.cat(ks), v=torch.cat(vs), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    ref = torch.cat([naive_attention(q, k, v) for q, k, v in zip(qs, ks, vs)])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_attention_row_invariant_to_batch_and_split():
    """A query's output is bit-identical alone, as a decode step, or inside a packed prefill."""
    qs, ks, vs, cu_q, cu_k = packed(LENGTHS, seed=3)
    out = attention_with_prefix(q=torch.cat(qs), k=torch.cat(ks), v=torch.cat(vs), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    q, k, v = qs[4], ks[4], vs[4]  # 130 queries over 131 keys
    lo = int(cu_q[4])
    for i in (0, 63, 64, 129):
        n_keys = k.shape[0] - q.shape[0] + i + 1
        single = attention_with_prefix(q=q[i : i + 1], k=k[:n_keys], v=v[:n_keys],
                                       cu_seqlens_q=torch.tensor([0, 1]), cu_seqlens_k=torch.tensor([0, n_keys]))
        assert torch.equal(single[0], out[lo + i]), i


def test_attention_rejects_more_queries_than_keys():
    """Queries are the last key positions; more queries than keys is an error naming the sequence."""
    with pytest.raises(ValueError, match="sequence 0"):
        attention_with_prefix(q=torch.randn(3, 2, 8), k=torch.randn(2, 2, 8), v=torch.randn(2, 2, 8),
                              cu_seqlens_q=torch.tensor([0, 3]), cu_seqlens_k=torch.tensor([0, 2]))
