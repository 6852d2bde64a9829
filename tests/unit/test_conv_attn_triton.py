"""Triton causal conv1d and paged attention match their references (in the interpreter on CPU)."""

import pytest
import torch

from mini_engine.ops.attention.triton import (
    DecodeTile,
    paged_decode_attention,
    paged_prefill_attention,
    write_kv_pages,
)
from mini_engine.ops.causal_conv1d.triton import causal_conv1d, causal_conv1d_update
from tests.unit.kernel_support import (
    check_conv_prefill,
    check_conv_steps_equal_prefill,
    check_conv_update,
    check_paged_decode,
    check_paged_prefill,
    offsets,
    paged_case,
)

LENGTHS = [1, 3, 0, 63, 65, 130]
DTYPES = [torch.float32, torch.float16]
PAGED = [dict(page_size=16, head_dim=16), dict(page_size=64, head_dim=32)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pooled", [False, True])
def test_conv_prefill_matches_reference(dtype, pooled):
    """Varlen prefill: outputs within tolerance, final states exact, written in place only into the named slots."""
    check_conv_prefill(lengths=LENGTHS, channels=37, width=4, dtype=dtype, device="cpu", pooled=pooled)


def test_conv_prefill_without_activation():
    """activation=None skips the SiLU exactly as the reference does."""
    check_conv_prefill(lengths=[2, 70], channels=5, width=4, dtype=torch.float32, device="cpu", pooled=True,
                       activation=None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_conv_update_matches_reference(dtype):
    """One decode step, plain (state left unchanged) and in place on shuffled slots."""
    check_conv_update(batch=5, channels=37, width=4, dtype=dtype, device="cpu")


def test_conv_update_steps_equal_prefill_bit_for_bit():
    """Decode steps in a slot reproduce the prefill of the same tokens exactly: outputs and final state."""
    check_conv_steps_equal_prefill(length=9, channels=6, width=4, device="cpu")


def test_conv_rejects_ambiguous_state():
    """A state tensor and a pool together, or slots without a pool, are errors that say what to pass."""
    x, weight = torch.zeros(2, 3), torch.zeros(3, 4)
    with pytest.raises(ValueError, match="either initial_state"):
        causal_conv1d(x=x, weight=weight, cu_seqlens=torch.tensor([0, 2]), initial_state=torch.zeros(1, 3, 3),
                      conv_pool=torch.zeros(2, 3, 3), slot_indices=torch.tensor([1], dtype=torch.int32))
    with pytest.raises(ValueError, match="needs conv_pool"):
        causal_conv1d_update(x=x, weight=weight, state=torch.zeros(2, 3, 3),
                             slot_indices=torch.tensor([0, 1], dtype=torch.int32))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", PAGED, ids=lambda s: f"page{s['page_size']}-d{s['head_dim']}")
def test_paged_prefill_matches_reference(dtype, shape):
    """Prefixes in shuffled pages plus new rows written by slot mapping: prefill equals attention_with_prefix."""
    check_paged_prefill(dtype=dtype, device="cpu", q_lens=[1, 3, 63, 65, 130], prefix_lens=[0, 5, 1, 64, 7],
                        hq=6, hkv=2, **shape)


@pytest.mark.parametrize("keys_per_split", [None, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", PAGED, ids=lambda s: f"page{s['page_size']}-d{s['head_dim']}")
def test_paged_decode_matches_reference(dtype, shape, keys_per_split):
    """Decode through the page table, whole or split over the keys, equals the reference's last row."""
    check_paged_decode(dtype=dtype, device="cpu", keys_per_split=keys_per_split, seq_lens=[1, 4, 64, 65, 137],
                       hq=6, hkv=2, **shape)


@pytest.mark.parametrize("block_k", [16, 64])
def test_paged_decode_matches_reference_in_every_tile(block_k):
    """The decode kernel's other key tiles (the default's is above), split and whole, equal the reference."""
    for keys_per_split in (None, 64):
        check_paged_decode(dtype=torch.float32, device="cpu", keys_per_split=keys_per_split,
                           tile=DecodeTile(block_k=block_k), seq_lens=[1, 17, 64, 65, 137], hq=8, hkv=2,
                           page_size=16, head_dim=32)


def _written_case(**kwargs):
    case = paged_case(hq=4, hkv=2, head_dim=16, page_size=16, dtype=torch.float32, **kwargs)
    write_kv_pages(k_cache=case.k_cache, v_cache=case.v_cache, k=case.new_k, v=case.new_v,
                   slot_mapping=case.slot_mapping)
    return case


def test_paged_rows_do_not_depend_on_the_batch():
    """A sequence's prefill and decode rows are bit-identical alone and packed with others."""
    case = _written_case(q_lens=[5, 70, 2], prefix_lens=[3, 10, 60])
    common = dict(k_cache=case.k_cache, v_cache=case.v_cache)
    packed = paged_prefill_attention(q=case.q, page_table=case.page_table, cu_seqlens_q=case.cu_seqlens_q,
                                     seq_lens=case.seq_lens, max_seqlen_q=70, **common)
    alone = paged_prefill_attention(q=case.q[5:75], page_table=case.page_table[1:2], cu_seqlens_q=offsets([70]),
                                    seq_lens=case.seq_lens[1:2], max_seqlen_q=70, **common)
    assert torch.equal(alone, packed[5:75])
    rows = case.q[[4, 74, 76]]  # each sequence's last query, as a decode step
    batch = paged_decode_attention(q=rows, page_table=case.page_table, seq_lens=case.seq_lens, keys_per_split=64,
                                   **common)
    single = paged_decode_attention(q=rows[1:2], page_table=case.page_table[1:2], seq_lens=case.seq_lens[1:2],
                                    keys_per_split=64, **common)
    assert torch.equal(single, batch[1:2])


def test_paged_attention_rejects_bad_layouts():
    """A non-int32 page table, or a split size that is not a multiple of 64 keys, is refused by name."""
    case = _written_case(q_lens=[1], prefix_lens=[4])
    common = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, seq_lens=case.seq_lens)
    with pytest.raises(ValueError, match="page_table must be int32"):
        paged_decode_attention(page_table=case.page_table.long(), **common)
    with pytest.raises(ValueError, match="keys_per_split=100"):
        paged_decode_attention(page_table=case.page_table, keys_per_split=100, **common)


@pytest.mark.parametrize("keys_per_split", [None, 64], ids=["whole", "split"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=str)
def test_gated_decode_is_attention_then_sigmoid_mul(keys_per_split, out_dtype):
    """With a gate, decode attention stores ``sigmoid_mul``'s bits laid out for the next projection (rows past the
    batch zero), reading the gate as a strided view of a fused projection, whole or split over the keys."""
    from mini_engine.ops.decode_rows.triton import sigmoid_mul

    case = _written_case(q_lens=[1, 1, 1], prefix_lens=[3, 70, 140])
    hq, d, batch, rows = 4, 16, 3, 8
    q = case.q  # [3, Hq, D]: each sequence's last query
    qkv = torch.randn(rows, hq * 2 * d + 7, generator=torch.Generator().manual_seed(3))  # per head: query | gate
    qkv[:batch, : hq * 2 * d].unflatten(1, (hq, 2 * d))[..., :d] = q
    common = dict(q=q, k_cache=case.k_cache, v_cache=case.v_cache, page_table=case.page_table, seq_lens=case.seq_lens,
                  keys_per_split=keys_per_split)
    want = sigmoid_mul(attn=paged_decode_attention(**common), qkv=qkv, heads=hq, head_dim=d, rows=rows,
                       out_dtype=out_dtype)
    gate = qkv[:batch, : hq * 2 * d].unflatten(1, (hq, 2 * d))[..., d:]
    got = paged_decode_attention(**common, gate=gate, rows=rows, out_dtype=out_dtype)
    assert got.dtype == out_dtype and torch.equal(got, want)
    assert not got[batch:].any() and got[:batch].abs().min(-1).values.gt(0).all()
    with pytest.raises(ValueError, match=r"gate must be \[3, 4, 16\]"):
        paged_decode_attention(**common, gate=gate[:2], rows=rows, out_dtype=out_dtype)
    with pytest.raises(ValueError, match="pass them with gate"):
        paged_decode_attention(**common, rows=rows)
