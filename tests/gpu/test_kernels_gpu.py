"""Triton kernels on CUDA match their references at bigger odd shapes, in fp32 (1e-5) and bf16 (1e-2).

The same checks as the interpreter tests (tests/unit/kernel_support.py), compiled for the device.
fp32 tiles multiply as 3xTF32 (mini_engine.ops.precision: float32's accuracy on the tensor cores).
"""

import pytest
import torch

from mini_engine.ops.attention.triton import DecodeTile
from tests.unit.kernel_support import (
    check_conv_prefill,
    check_conv_steps_equal_prefill,
    check_conv_update,
    check_copy_slots,
    check_fused_projection,
    check_linear,
    check_paged_decode,
    check_paged_prefill,
    check_row_digests,
    check_slot_checksums,
    check_state_copy,
    check_state_digest,
    check_state_memo,
)

DTYPES = [torch.float32, torch.bfloat16]
PAGED = [dict(page_size=16, head_dim=128), dict(page_size=64, head_dim=256)]
# Qwen3.5-0.8B-shaped linear state: conv over 6144 channels, 16 value heads of 128 x 128.
ENGINE_STATE = dict(n_slots=12, layers=3, conv=(6144, 3), rec=(16, 128, 128), width=6176)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pooled", [False, True])
def test_conv_prefill(dtype, pooled):
    """Varlen prefill on CUDA: outputs within tolerance, final states exact, only the named slots written."""
    check_conv_prefill(lengths=[1, 3, 0, 63, 65, 130, 1000, 4097], channels=1000, width=4, dtype=dtype,
                       device="cuda", pooled=pooled)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_conv_update(dtype):
    """One decode step at batch 67 over 6144 channels, plain and in place."""
    check_conv_update(batch=67, channels=6144, width=4, dtype=dtype, device="cuda")


def test_conv_update_steps_equal_prefill():
    """Compiled update steps reproduce the compiled prefill bit for bit (the exactness contract)."""
    check_conv_steps_equal_prefill(length=70, channels=300, width=4, device="cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", PAGED, ids=lambda s: f"page{s['page_size']}-d{s['head_dim']}")
def test_paged_prefill(dtype, shape):
    """Prefill with prefixes in shuffled pages, 8 query / 2 kv heads, equals attention_with_prefix."""
    check_paged_prefill(dtype=dtype, device="cuda", q_lens=[1, 3, 63, 65, 130, 700],
                        prefix_lens=[0, 5, 1, 64, 7, 1500], hq=8, hkv=2, **shape)


@pytest.mark.parametrize("keys_per_split", [None, 64, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", PAGED, ids=lambda s: f"page{s['page_size']}-d{s['head_dim']}")
def test_paged_decode(dtype, shape, keys_per_split):
    """Decode through the page table, whole or split over the keys, up to 4097 keys."""
    check_paged_decode(dtype=dtype, device="cuda", keys_per_split=keys_per_split,
                       seq_lens=[1, 4, 64, 65, 137, 1000, 4097], hq=8, hkv=2, **shape)


@pytest.mark.parametrize("tile", [DecodeTile(16, 4, 1), DecodeTile(64, 4, 2), DecodeTile(64, 8, 2)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_decode_in_every_tile(dtype, tile):
    """The decode kernel's other tiles (``decode_attention.py`` times them) at the 0.8B model's heads."""
    check_paged_decode(dtype=dtype, device="cuda", keys_per_split=64, tile=tile,
                       seq_lens=[1, 65, 137, 1000, 4097], hq=8, hkv=2, page_size=16, head_dim=256)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(6, 3, 16, 128, 129), (5, 3, 63, 6176)], ids=str)
def test_slot_checksums(shape, dtype):
    """Digests of many slots in one launch equal the reference bit for bit, whole and cut to rows."""
    check_slot_checksums(shape=shape, dtype=dtype, device="cuda")


@pytest.mark.parametrize("width", [259, 8192, 3 * 8192 + 5, 248320])
def test_row_digests(width):
    """The logits check of each row equals its reference digest, launched compiled from the second call on, and
    from a row past a 16-byte boundary; up to Qwen3.5's vocabulary."""
    check_row_digests(device="cuda", width=width)


def test_state_digest():
    """conv | rec | pending rows of engine-shaped slots, digested as segments, equal their bytes' digest."""
    check_state_digest(device="cuda", **ENGINE_STATE)


def test_state_memo():
    """The memo's digests of slots a simulated decode advances equal the read-back digests at every step."""
    check_state_memo(device="cuda", **ENGINE_STATE)


@pytest.mark.parametrize("recurrent", [True, False])
def test_copy_slots(recurrent):
    """Batched clone / restore of engine-shaped slots equals the index_copy reference on every pool."""
    check_copy_slots(device="cuda", recurrent=recurrent, **ENGINE_STATE)


@pytest.mark.parametrize("recurrent", [True, False])
def test_state_copy(recurrent):
    """A ledger's restore / clone: one launch copies engine-shaped states (0, 17 and 63 rows) and digests the source
    as read and the destination as left, against the torch copies and the reference digests."""
    check_state_copy(device="cuda", recurrent=recurrent, **ENGINE_STATE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [1, 77, 1000, 4097])
@pytest.mark.parametrize(("n_out", "n_in"), [(8224, 1024), (1024, 3584), (260, 1024)])
def test_linear(dtype, rows, n_out, n_in):
    """The prefill's projections at Qwen3.5-0.8B's shapes (the GDN in_proj, the MLP's down_proj, the byte
    head): within tolerance, and a row's bits the same alone, in the batch, or in another batch."""
    check_linear(rows=rows, n_out=n_out, n_in=n_in, dtype=dtype, device="cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_projection(dtype):
    """The GDN layer's fused qkv | z | b | a at Qwen3.5-0.8B's widths: each part's columns are its own gemm's bits
    (b starts inside a column tile)."""
    check_fused_projection(rows=1000, widths=(6144, 2048, 16, 16), n_in=1024, dtype=dtype, device="cuda")
