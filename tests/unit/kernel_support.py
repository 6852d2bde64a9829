"""Inputs shared by the Triton kernel tests (interpreter on CPU, tests/gpu on CUDA): odd shapes, shuffled pages."""

from __future__ import annotations

from itertools import accumulate
from typing import NamedTuple

import pytest
import torch

from mini_engine.model.layers import FusedProjection
from mini_engine.model.state import state_bytes
from mini_engine.ops import causal_conv1d as reference_conv
from mini_engine.ops import causal_conv1d_update as reference_conv_update
from mini_engine.ops.attention import attention_with_prefix, gather_pages
from mini_engine.ops.attention.triton import (
    DECODE_TILE,
    paged_decode_attention,
    paged_prefill_attention,
    write_kv_pages,
)
from mini_engine.ops.causal_conv1d.triton import causal_conv1d, causal_conv1d_update
from mini_engine.ops.checksum import slot_checksum
from mini_engine.ops.checksum.memo import StateMemo
from mini_engine.ops.checksum.state_triton import StateCopier, StateDigester, copy_state_lanes, state_lanes
from mini_engine.ops.checksum.triton import CHUNK, digests, row_digests, slot_checksums
from mini_engine.ops.linear import linear as reference_linear
from mini_engine.ops.linear.triton import linear
from mini_engine.ops.slot_copy import copy_slots as reference_copy_slots
from mini_engine.ops.slot_copy.triton import copy_slots

# Normwise relative error bounds (issue 9): fp32 kernels against the fp32 reference, low precision looser.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (0 when both are empty)."""
    diff = (actual.double() - expected.double()).norm()
    scale = expected.double().norm()
    return float(diff / scale) if scale > 0 else float(diff)


def offsets(lengths, device="cpu") -> torch.Tensor:
    """``cu_seqlens`` of a packed batch: [0, l0, l0 + l1, ...] (int64, like the engine's)."""
    return torch.tensor([0, *accumulate(lengths)], device=device)


def randn(*shape, gen, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """Seeded normal values drawn on the CPU (the same numbers on every device), then moved."""
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


class PagedCase(NamedTuple):
    """Sequences whose prefixes sit in shuffled pages; their new rows still to be written."""

    q: torch.Tensor  # [Tq, Hq, D] new queries, packed
    cu_seqlens_q: torch.Tensor
    k: torch.Tensor  # [Tk, Hkv, D] every key of every sequence, packed (the reference's input)
    v: torch.Tensor
    cu_seqlens_k: torch.Tensor
    k_cache: torch.Tensor  # [n_pages, page_size, Hkv, D]: prefixes written, everything else NaN
    v_cache: torch.Tensor
    page_table: torch.Tensor  # [B, max_pages] int32; unused entries name an all-NaN page
    seq_lens: torch.Tensor  # [B] keys per sequence (prefix + new)
    new_k: torch.Tensor  # [Tq, Hkv, D] the new rows, packed like q
    new_v: torch.Tensor
    slot_mapping: torch.Tensor  # [Tq] page * page_size + offset of each new row


def paged_case(*, q_lens, prefix_lens, hq, hkv, head_dim, page_size, dtype, device="cpu", seed=0) -> PagedCase:
    """A paged batch whose unused cache rows and page-table entries are NaN traps: reading one shows."""
    gen = torch.Generator().manual_seed(seed)
    k_lens = [a + b for a, b in zip(q_lens, prefix_lens)]
    max_pages = max(-(-n // page_size) for n in k_lens) + 1
    n_pages = sum(-(-n // page_size) for n in k_lens) + 2
    order = torch.randperm(n_pages, generator=gen).tolist()
    trap = order.pop()  # an all-NaN page that padding entries of the table name
    table = torch.full((len(k_lens), max_pages), trap, dtype=torch.int32)
    k = randn(sum(k_lens), hkv, head_dim, gen=gen, dtype=dtype)
    v = randn(sum(k_lens), hkv, head_dim, gen=gen, dtype=dtype)
    caches = [torch.full((n_pages, page_size, hkv, head_dim), float("nan"), dtype=dtype) for _ in range(2)]
    cu_k, new_rows, slots = offsets(k_lens), [], []
    for b, (n_k, n_prefix) in enumerate(zip(k_lens, prefix_lens)):
        pages = [order.pop() for _ in range(-(-n_k // page_size))]
        table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        positions = torch.arange(n_k)
        page_of, offset = torch.tensor(pages)[positions // page_size], positions % page_size
        rows, cached = int(cu_k[b]) + positions, positions < n_prefix
        for cache, src in zip(caches, (k, v)):
            cache[page_of[cached], offset[cached]] = src[rows[cached]]
        new_rows += rows[~cached].tolist()
        slots += (page_of * page_size + offset)[~cached].tolist()
    q = randn(sum(q_lens), hq, head_dim, gen=gen, dtype=dtype)
    parts = (q, offsets(q_lens), k, v, cu_k, *caches, table, torch.tensor(k_lens), k[new_rows], v[new_rows],
             torch.tensor(slots, dtype=torch.int64))
    return PagedCase(*(t.to(device) for t in parts))


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> float:
    error = relative_error(actual, expected)
    assert error <= TOLERANCE[dtype], f"{what}: relative error {error:.3g} > {TOLERANCE[dtype]:g} ({dtype})"
    return error


def check_conv_prefill(*, lengths, channels, width, dtype, device, pooled, activation="silu", seed=0) -> float:
    """Triton prefill vs the reference: output within tolerance, final states exact, other slots untouched."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(sum(lengths), channels, gen=gen, dtype=dtype, device=device)
    weight = randn(channels, width, gen=gen, dtype=dtype, device=device)
    cu = offsets(lengths, device)
    if not pooled:
        init = randn(len(lengths), channels, width - 1, gen=gen, dtype=dtype, device=device)
        for state in (init, None):
            want = reference_conv(x=x, weight=weight, cu_seqlens=cu, initial_state=state, activation=activation)
            got = causal_conv1d(x=x, weight=weight, cu_seqlens=cu, initial_state=state, activation=activation)
            error = _assert_close(got.output, want.output, dtype, "conv prefill output")
            assert torch.equal(got.final_state, want.final_state), "conv prefill final state"
        return error
    store = randn(2 * len(lengths) + 3, 2, channels, width - 1, gen=gen, device=device)
    pool = store[:, 1]  # one layer of an engine-like [slots, layers, C, W-1] store: a strided view
    slots = torch.randperm(pool.shape[0], generator=gen)[: len(lengths)].to(device=device, dtype=torch.int32)
    before = store.clone()
    want = reference_conv(x=x, weight=weight, cu_seqlens=cu, initial_state=pool[slots.long()], activation=activation)
    got = causal_conv1d(x=x, weight=weight, cu_seqlens=cu, conv_pool=pool, slot_indices=slots, activation=activation)
    assert got.final_state is None
    assert torch.equal(pool[slots.long()], want.final_state), "conv prefill final state in the pool"
    before[:, 1][slots.long()] = want.final_state
    assert torch.equal(store, before), "conv prefill wrote outside its slots"
    return _assert_close(got.output, want.output, dtype, "conv prefill output")


def check_conv_update(*, batch, channels, width, dtype, device, seed=0) -> float:
    """Triton update vs the reference, plain and in place on shuffled slots; returns the worse error."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(batch, channels, gen=gen, dtype=dtype, device=device)
    weight = randn(channels, width, gen=gen, dtype=dtype, device=device)
    state = randn(batch, channels, width - 1, gen=gen, dtype=dtype, device=device)
    want = reference_conv_update(x=x, weight=weight, state=state)
    original = state.clone()
    got = causal_conv1d_update(x=x, weight=weight, state=state)
    assert torch.equal(state, original) and torch.equal(got.final_state, want.final_state)
    errors = [_assert_close(got.output, want.output, dtype, "conv update output")]
    pool = randn(batch + 5, channels, width - 1, gen=gen, device=device)
    slots = torch.randperm(pool.shape[0], generator=gen)[:batch].to(device=device, dtype=torch.int32)
    want = reference_conv_update(x=x, weight=weight, state=pool[slots.long()])
    before = pool.clone()
    got = causal_conv1d_update(x=x, weight=weight, conv_pool=pool, slot_indices=slots)
    before[slots.long()] = want.final_state
    assert got.final_state is None and torch.equal(pool, before), "conv update state in the pool"
    errors.append(_assert_close(got.output, want.output, dtype, "conv update output (pool)"))
    return max(errors)


def check_conv_steps_equal_prefill(*, length, channels, width, device, seed=5) -> None:
    """Update steps in a slot reproduce the prefill of the same tokens bit for bit: outputs and final state."""
    gen = torch.Generator().manual_seed(seed)
    x, weight = randn(length, channels, gen=gen, device=device), randn(channels, width, gen=gen, device=device)
    pool = randn(3, channels, width - 1, gen=gen, device=device)
    slot = torch.tensor([2], dtype=torch.int32, device=device)
    prefill_pool = pool.clone()
    whole = causal_conv1d(x=x, weight=weight, cu_seqlens=offsets([length], device), conv_pool=prefill_pool,
                          slot_indices=slot)
    steps = [causal_conv1d_update(x=x[t : t + 1], weight=weight, conv_pool=pool, slot_indices=slot).output
             for t in range(length)]
    assert torch.equal(torch.cat(steps), whole.output), "update outputs"
    assert torch.equal(pool, prefill_pool), "update final state"


def check_paged_prefill(*, dtype, device, **shape) -> float:
    """Write the new rows into their pages, then prefill attention vs attention_with_prefix on all keys."""
    case = paged_case(dtype=dtype, device=device, **shape)
    write_kv_pages(k_cache=case.k_cache, v_cache=case.v_cache, k=case.new_k, v=case.new_v,
                   slot_mapping=case.slot_mapping)
    written = case.k_cache.flatten(0, 1)[case.slot_mapping]
    assert torch.equal(written, case.new_k), "write_kv_pages put rows where the slot mapping says"
    paged = gather_pages(cache=case.v_cache, page_table=case.page_table, seq_lens=case.seq_lens)
    assert torch.equal(paged, case.v), "every key of every sequence is in its pages"
    out = paged_prefill_attention(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, page_table=case.page_table,
                                  cu_seqlens_q=case.cu_seqlens_q, seq_lens=case.seq_lens,
                                  max_seqlen_q=max(shape["q_lens"]))
    want = attention_with_prefix(q=case.q, k=case.k, v=case.v, cu_seqlens_q=case.cu_seqlens_q,
                                 cu_seqlens_k=case.cu_seqlens_k)
    return _assert_close(out, want, dtype, "paged prefill attention")


def check_paged_decode(*, dtype, device, keys_per_split, tile=DECODE_TILE, **shape) -> float:
    """Decode (one query per sequence at its last position, in ``tile``) vs attention_with_prefix."""
    lens = shape.pop("seq_lens")
    case = paged_case(dtype=dtype, device=device, q_lens=[1] * len(lens), prefix_lens=[n - 1 for n in lens], **shape)
    write_kv_pages(k_cache=case.k_cache, v_cache=case.v_cache, k=case.new_k, v=case.new_v,
                   slot_mapping=case.slot_mapping)
    out = paged_decode_attention(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, page_table=case.page_table,
                                 seq_lens=case.seq_lens, keys_per_split=keys_per_split, tile=tile)
    want = attention_with_prefix(q=case.q, k=case.k, v=case.v, cu_seqlens_q=case.cu_seqlens_q,
                                 cu_seqlens_k=case.cu_seqlens_k)
    return _assert_close(out, want, dtype, f"paged decode attention (keys_per_split={keys_per_split}, {tile})")


def random_pool(*shape, dtype, gen, device="cpu") -> torch.Tensor:
    """A pool of random bytes: normal floats, or integers over the dtype's whole range."""
    if dtype.is_floating_point:
        return randn(*shape, gen=gen, dtype=dtype, device=device)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=dtype).to(device)


def check_slot_checksums(*, shape, dtype, device, seed=0) -> None:
    """Digests of listed slots (shuffled, repeated) of a pool equal the reference's, whole and cut to rows."""
    gen = torch.Generator().manual_seed(seed)
    pool = random_pool(*shape, dtype=dtype, gen=gen, device=device)
    slots = torch.randint(0, shape[0], (5,), generator=gen, dtype=torch.int32).to(device)
    assert slot_checksums(pool=pool, slots=slots) == [slot_checksum(pool[s]) for s in slots.tolist()]
    if len(shape) >= 4:
        rows = torch.tensor([0, shape[2], 1, shape[2] // 2, 3]).clamp(max=shape[2]).to(device)
        want = [slot_checksum(pool[s, :, :n]) for s, n in zip(slots.tolist(), rows.tolist())]
        assert slot_checksums(pool=pool, slots=slots, rows=rows) == want


def engine_state_pools(*, n_slots, layers, conv, rec, width, device, seed=0):
    """Engine-shaped float32 state pools: conv [S, L, *conv], rec [S, L, *rec], pending [S, L, 63, width]."""
    gen = torch.Generator().manual_seed(seed)
    return (randn(n_slots, layers, *conv, gen=gen, device=device), randn(n_slots, layers, *rec, gen=gen, device=device),
            randn(n_slots, layers, 63, width, gen=gen, device=device))


def check_state_digest(*, device, **shapes) -> None:
    """conv | rec | pending rows (token order) of each slot, digested as segments in one launch, equal the digest of
    its bytes (``state_bytes``): a slot listed twice, at a chunk's start, with 63 rows and a few. A ``StateDigester``
    launches its compiled kernels from its second call on (on a GPU): again, for fewer slots from an index 4 bytes
    past a 16-byte boundary, into rows of a batch's results."""
    conv, rec, pending = engine_state_pools(device=device, **shapes)
    slots = torch.tensor([3, 1, 3], dtype=torch.int32, device=device)
    lengths = torch.tensor([128, 63, 81], dtype=torch.int32, device=device)
    lanes = state_lanes(conv=conv, rec=rec, pending=pending, slots=slots, lengths=lengths)
    want = _read_back(conv, rec, pending, slots.tolist(), lengths.tolist())
    assert digests(lanes) == want
    digest = StateDigester(conv=conv, rec=rec, pending=pending)
    assert digests(digest(slots, lengths)) == digests(digest(slots, lengths)) == want
    # into rows of a batch's results (``DigestRows``), read back whole or through a fresh memo, rows around untouched
    results = torch.zeros((8, 2), dtype=torch.int64, device=device)
    digest(slots[1:], lengths[1:], out=results[1:3])
    tracked = StateDigester(conv=conv, rec=rec, pending=pending, memo=StateMemo(conv.shape[0], conv.device))
    tracked(slots[:2], lengths[:2], out=results[4:6])
    assert digests(results) == [0, *want[1:], 0, *want[:2], 0, 0]
    assert digests(tracked(slots[1:2], lengths[1:2])) == want[1:2]  # the memo's now, compiled: the same digest
    with pytest.raises(ValueError, match=r"out must be int64 \[2, 2\]"):
        state_lanes(conv=conv, rec=rec, pending=pending, slots=slots[1:], lengths=lengths[1:], out=results[:3])


def check_row_digests(*, device, width) -> None:
    """``row_digests`` (the logits check): each row's ``slot_checksum`` as an int64 bit pattern, rows of one chunk
    (one launch) and of several (partial lanes joined by a second launch), float32 and int32 rows with the sign bit
    set; ``drop_sign`` clears the top bit alone. Each table twice (on a GPU the second launch is the compiled
    kernel's), then from its second row (past a 16-byte boundary for most widths: a compiled kernel of its own)."""
    assert CHUNK == 8192, "the widths straddle one chunk"
    gen = torch.Generator().manual_seed(width)
    floats = torch.randn(3, width, generator=gen).to(device)
    ints = torch.randint(-(2**31), 2**31 - 1, (2, width), generator=gen, dtype=torch.int32).to(device)
    for table in (floats, ints):
        want = [slot_checksum(row.cpu()) for row in table]
        for rows, expected in ((table, want), (table, want), (table[1:], want[1:])):
            assert [v & ((1 << 64) - 1) for v in row_digests(rows).tolist()] == expected
            assert row_digests(rows, drop_sign=True).tolist() == [w & ((1 << 63) - 1) for w in expected]


def _read_back(conv, rec, pending, slots, lengths) -> list[int]:
    return [slot_checksum(state_bytes(conv[s], rec[s], pending[s, :, : n % 64]).cpu()) for s, n in zip(slots, lengths)]


def check_state_memo(*, device, **shapes) -> None:
    """The memo's digests (``state_lanes(memo=)``, and ``StateMemo.host_digest`` on copies) of slots a simulated
    decode advances (conv rewritten, a row appended a step, rec rewritten as a chunk completes) equal the read-back
    digests of their bytes at every step: across a chunk's end, after a write the memo forgets, after steps nobody
    digested. A digest within a chunk reads conv and the new rows alone (the memo's byte count); a write the memo
    was not told of shows only in the slot's next chunk."""
    conv, rec, pending = engine_state_pools(device=device, **shapes)
    memo, host = StateMemo(conv.shape[0], conv.device), StateMemo(conv.shape[0], torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    lengths = {1: 58, 3: 3}
    word_bytes = {"conv": conv[0].nbytes, "rec": rec[0].nbytes, "row": pending[0, :, 0].nbytes}

    def write(pool, index):
        pool[index] = randn(*pool[index].shape, gen=gen, device=device)

    def decode(slot):
        n = lengths[slot]
        write(conv, slot)
        if n % 64 == 63:  # the token completes its chunk: the state goes to rec, no row
            write(rec, slot)
        else:
            write(pending, (slot, slice(None), n % 64))
        lengths[slot] = n + 1

    tracked = StateDigester(conv=conv, rec=rec, pending=pending, memo=memo)  # compiled from its second call (GPU)

    def digest():
        slots = list(lengths)
        before = int(memo.hashed)
        lanes = tracked(torch.tensor(slots, device=device), torch.tensor([lengths[s] for s in slots], device=device))
        on_host = [host.host_digest(conv[s].cpu(), rec[s].cpu(), pending[s].cpu(), s, lengths[s]) for s in slots]
        want = _read_back(conv, rec, pending, slots, [lengths[s] for s in slots])
        assert digests(lanes) == on_host == want, lengths
        return int(memo.hashed) - before

    assert digest() == sum(word_bytes["conv"] + word_bytes["rec"] + n % 64 * word_bytes["row"]
                           for n in lengths.values()), "no memo: the whole states"
    for step in range(12):  # slot 1 completes its chunk at step 5
        for slot in lengths:
            decode(slot)
        if step in (7, 8):  # steps nobody digested: the next digest reads their rows too
            continue
        if step == 9:  # a restore into slot 3: a write the memo is told of
            write(rec, 3)
            write(pending, (3, slice(None), slice(0, lengths[3] % 64)))
            memo.forget(3)
            host.forget(3)
        read = digest()
        if step in (2, 3):
            assert read == 2 * (word_bytes["conv"] + word_bytes["row"]), "within a chunk: conv and the new row"
    write(rec, 1)  # a write that bypasses the memo: the read-back digest sees it, the memo's does not ...
    lanes = tracked(torch.tensor([1], device=device), torch.tensor([lengths[1]], device=device))
    assert digests(lanes) != _read_back(conv, rec, pending, [1], [lengths[1]])
    while lengths[1] % 64:  # ... until the slot's next chunk
        decode(1)
    lanes = tracked(torch.tensor([1], device=device), torch.tensor([lengths[1]], device=device))
    assert digests(lanes) == _read_back(conv, rec, pending, [1], [lengths[1]])


def check_copy_slots(*, device, recurrent=True, **shapes) -> None:
    """Batched copy of shuffled pairs equals the index_copy reference on every pool, untouched slots included."""
    pools = engine_state_pools(device=device, **shapes)
    expected = [p.clone() for p in pools]
    gen = torch.Generator().manual_seed(7)
    order = torch.randperm(shapes["n_slots"], generator=gen)
    dst, src = order[:3].to(torch.int32).to(device), order[3:6].to(torch.int32).to(device)
    rows = torch.tensor([63, 0, 5], device=device)
    kept = 2 if recurrent else 1  # restore_rec=off copies conv and pending only
    reference_copy_slots(pools=expected[:kept], dst=dst, src=src, pending=expected[2], rows=rows)
    copy_slots(pools=pools[:kept], dst=dst, src=src, pending=pools[2], rows=rows)
    for name, got, want in zip(("conv", "rec", "pending"), pools, expected):
        assert torch.equal(got, want), name


ALL_ROWS_COPIES = ((4, 1, 128), (2, 6, 81), (1, 5, 63), (6, 2, 81))  # (dst, src, length)


def check_state_copy(*, device, recurrent=True, copies=ALL_ROWS_COPIES, **shapes) -> None:
    """``copy_state_lanes``: each copy (by default a state with no pending rows, with 17, with 63; a slot copied back
    into the one it came from) leaves the pools as ``StateStorage.copy_slot``'s torch copies do (rec kept with ``recurrent`` off,
    the rows past the state's length and every other slot untouched), and its two digests are the reference
    digests of the source's state before the copy and of the destination's after it. Given the running-copy
    counts and the digest memo (every copy but the first), it forgets dst's entries of both (-1), nothing else."""
    pools = engine_state_pools(device=device, **shapes)
    expected = [p.clone() for p in pools]
    slots, layers = pools[0].shape[:2]
    run_rows = torch.arange(slots * layers * 2, dtype=torch.int32, device=device).view(slots, layers, 2)
    memo = StateMemo(slots, pools[0].device)
    memo.lengths.copy_(torch.arange(slots, dtype=torch.int32))
    kept_runs, kept_lengths = run_rows.clone(), memo.lengths.clone()
    copier = StateCopier(conv=pools[0], rec=pools[1], pending=pools[2], run_rows=run_rows, memo=memo)
    for i, (dst, src, length) in enumerate(copies):
        read = _read_back(*expected, [src], [length])
        rows = length % 64
        expected[0][dst].copy_(expected[0][src])
        if recurrent:
            expected[1][dst].copy_(expected[1][src])
        expected[2][dst, :, :rows].copy_(expected[2][src, :, :rows])
        if i:
            kept_runs[dst], kept_lengths[dst] = -1, -1
        out = torch.zeros((3, 2), dtype=torch.int64, device=device)  # into rows of a batch's results, the last one
        if i:  # one copier's launches: on a GPU the compiled kernel's from the second on
            lanes = copier(dst, src, length, recurrent=recurrent, out=out[:2])
        else:
            lanes = copy_state_lanes(conv=pools[0], rec=pools[1], pending=pools[2], dst=dst, src=src, length=length,
                                     recurrent=recurrent, out=out[:2])
        assert out[2].tolist() == [0, 0] and lanes.data_ptr() == out.data_ptr()
        for name, got, want in zip(("conv", "rec", "pending", "run_rows", "memo"), [*pools, run_rows, memo.lengths],
                                   [*expected, kept_runs, kept_lengths]):
            assert torch.equal(got, want), (name, dst, src, length)
        assert digests(lanes) == [*read, *_read_back(*expected, [dst], [length])], (dst, src, length)
    if not recurrent:  # the copy left the destination's own rec: its digest is not the source's
        assert digests(lanes)[0] != digests(lanes)[1]
    assert copier._launch.keys == ([recurrent] if device == "cuda" else []), "compiled launches: on a GPU only"


def check_fused_projection(*, rows, widths, n_in, dtype, device, seed=0) -> None:
    """One gemm of a ``FusedProjection`` of parts ``widths`` wide: each part's columns are the bits of the part's
    own gemm (what lets the Triton prefill and the decode step fuse the projections that read the same rows)."""
    gen = torch.Generator().manual_seed(seed)
    parts = [torch.nn.Linear(n_in, n, bias=False) for n in widths]
    for part in parts:
        part.weight.data = (randn(part.weight.shape[0], n_in, gen=gen) * n_in ** -0.5).to(device=device, dtype=dtype)
    fused = FusedProjection(*parts)
    x = randn(rows, n_in, gen=gen, device=device)
    for part, columns in zip(parts, linear(x, fused.weight()).split(fused.widths, dim=-1)):
        assert torch.equal(columns, linear(x, part.weight)), f"the part {part.weight.shape[0]} wide"


def check_linear(*, rows, n_out, n_in, dtype, device, seed=0) -> float:
    """The one-launch projection at ``rows`` rows of a float32 input: within tolerance of the reference
    (``inv.linear``: rounded through the weight's dtype like it), every element written, and each row's
    bits the same computed alone, in the full batch, or at another place in a smaller one."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(rows, n_in, gen=gen, device=device)
    weight = (randn(n_out, n_in, gen=gen) * n_in ** -0.5).to(device=device, dtype=dtype)
    got = linear(x, weight)
    assert got.shape == (rows, n_out) and got.dtype == torch.float32 and not got.isnan().any()
    error = _assert_close(got, reference_linear(x, weight), dtype, "linear")
    assert torch.equal(got, got.to(dtype).float()), "the result is not rounded through the weight's dtype"
    for pick in sorted({0, rows // 2, rows - 1}):
        assert torch.equal(linear(x[pick : pick + 1], weight)[0], got[pick]), f"row {pick} alone"
    tail = x[rows // 3 :]
    assert torch.equal(linear(tail, weight), got[rows // 3 :]), "the rows after the first third, as a batch"
    return error
