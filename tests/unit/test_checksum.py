"""The slot checksum sees every byte and nothing else."""

import struct

import torch

from mini_engine.ops.checksum import slot_checksum

MASK = 0xFFFFFFFF


def python_checksum(data: bytes) -> int:
    """An independent pure-Python implementation of the documented formula."""
    data += b"\0" * (-len(data) % 4)
    halves = []
    for offset in (0x9E3779B1, 0x85EBCA77):
        total = 0
        for i, (word,) in enumerate(struct.iter_unpack("<I", data)):
            x = (word + i * offset) & MASK
            x = ((x ^ (x >> 16)) * 0x45D9F3B) & MASK
            x = ((x ^ (x >> 16)) * 0x45D9F3B) & MASK
            total += x ^ (x >> 16)
        halves.append(total & MASK)
    return (halves[0] << 32) | halves[1]


def test_matches_independent_implementation():
    """The torch computation equals the formula written out in plain Python."""
    t = torch.randn(3, 5, 7)
    assert slot_checksum(t) == python_checksum(t.numpy().tobytes())
    odd = torch.arange(7, dtype=torch.uint8)
    assert slot_checksum(odd) == python_checksum(bytes(range(7)))


def test_wrapping_32_bit_arithmetic_matches_the_formula_at_every_length():
    """The reference's int32 arithmetic (wrapping products and sums, masked shifts) gives the formula's digest for
    words with the sign bit set and clear, at lengths that end inside and outside a vector register's width, and
    for words given as int64 values."""
    from mini_engine.ops.checksum import checksum_words

    gen = torch.Generator().manual_seed(5)
    for n in [*range(1, 40), 257, 4099]:
        words = torch.randint(-(2**31), 2**31, (n,), generator=gen, dtype=torch.int32)
        words[: min(n, 4)] = torch.tensor([-1, -(2**31), 2**31 - 1, 0])[: min(n, 4)]
        want = python_checksum(words.numpy().tobytes())
        assert slot_checksum(words) == want, n
        assert checksum_words(words.to(torch.int64) & MASK) == want, n


def test_every_single_bit_flip_changes_the_digest():
    """Flipping any one bit of a small slot changes the checksum."""
    t = torch.randn(4, 4)
    base = slot_checksum(t)
    raw = t.view(torch.int32).flatten()
    for i in range(raw.numel()):
        for bit in (0, 13, 31):
            flipped = raw.clone()
            flipped[i] ^= (1 << bit) if bit < 31 else -(1 << 31)
            assert slot_checksum(flipped.view(torch.float32)) != base, (i, bit)


def test_position_and_content_not_layout():
    """Permuting words changes the digest; equal bytes in another view or a copy do not."""
    t = torch.randn(8, 8)
    assert slot_checksum(t) != slot_checksum(t.flip(0))
    assert slot_checksum(t) == slot_checksum(t.clone().reshape(64))
    assert slot_checksum(t.t().contiguous().t()) == slot_checksum(t)
    assert 0 <= slot_checksum(t) < 2**64


def test_checksum_ints_is_the_digest_of_the_int32_tensor():
    """The plain-Python digest of a list of ints (a staged page table) is ``slot_checksum`` of the same values as an
    int32 tensor: sign bits set and clear, the empty list, a tuple; values beyond int32 are refused, named by
    index."""
    import random

    import pytest

    from mini_engine.ops.checksum.reference import checksum_ints

    rnd = random.Random(5)
    for n in (0, 1, 7, 33, 600):
        values = [rnd.randrange(-(1 << 31), 1 << 31) for _ in range(n)]
        values[:2] = [-(1 << 31), (1 << 31) - 1][: min(n, 2)]
        assert checksum_ints(values) == slot_checksum(torch.tensor(values, dtype=torch.int32)), n
        assert checksum_ints(tuple(values)) == checksum_ints(values), n
    for bad in (1 << 31, -(1 << 31) - 1, 1 << 70):
        with pytest.raises(ValueError, match=f"int32 values; got {bad} at index 1$"):
            checksum_ints([0, bad, 0])


def test_checksum_bytes_is_the_digest_of_the_tensor_with_those_bytes():
    """The digest of a buffer's bytes (a staged metadata shard's key) is ``slot_checksum`` of a tensor holding them:
    int32 tables, an odd count of bytes (zero-padded to a whole word), none."""
    from mini_engine.ops.checksum import checksum_bytes

    table = torch.randint(-(1 << 31), (1 << 31) - 1, (16, 24), dtype=torch.int32)
    assert checksum_bytes(table.numpy().tobytes()) == slot_checksum(table)
    assert checksum_bytes(table[:, :3].contiguous().numpy().tobytes()) == slot_checksum(table[:, :3])
    odd = torch.tensor([1, 2, 255, 7, 9], dtype=torch.uint8)
    assert checksum_bytes(bytes([1, 2, 255, 7, 9])) == slot_checksum(odd) != checksum_bytes(bytes([1, 2, 255, 7]))
    assert checksum_bytes(b"") == slot_checksum(torch.zeros(0, dtype=torch.int32))


def test_row_checksums_are_each_rows_checksum():
    """One pass over a batch's rows gives each row's ``slot_checksum``: float32 logits, bfloat16 rows of an odd
    number of 16-bit values (the last word zero-padded), int32 rows of more dimensions, one row, none."""
    from mini_engine.ops.checksum.reference import row_checksums

    gen = torch.Generator().manual_seed(11)
    for rows in (torch.randn(4, 259, generator=gen), torch.randn(3, 7, generator=gen).to(torch.bfloat16),
                 torch.randint(-(2**31), 2**31, (2, 3, 5), generator=gen, dtype=torch.int32),
                 torch.randn(1, 16, generator=gen)):
        assert row_checksums(rows) == [slot_checksum(row) for row in rows]
    assert row_checksums(torch.empty(0, 9)) == []


def test_a_digest_cache_digests_a_key_once_and_forgets_all_when_full():
    """``DigestCache``: a key's digest is computed once while kept; past ``limit`` keys every kept one is
    forgotten (the next use of a key digests it again); a limit under one is refused."""
    import pytest

    from mini_engine.ops.checksum.memo import DigestCache

    calls = []

    def digest(values):
        calls.append(values)
        return sum(values)

    cache = DigestCache(2)
    assert [cache.get(k, digest, k) for k in [(1,), (2, 3), (1,), (2, 3)]] == [1, 5, 1, 5] and len(calls) == 2
    assert cache.get((4,), digest, (4,)) == 4 and cache.get((1,), digest, (1,)) == 1 and len(calls) == 4
    with pytest.raises(ValueError, match="limit must be >= 1"):
        DigestCache(0)

