"""Float32 reference of causal attention of new queries over a cached prefix plus the new keys.

Each sequence brings ``len_k`` keys/values (its cached prefix followed by its new tokens) and
``len_q <= len_k`` queries: the last ``len_q`` positions. Query at absolute position ``p`` attends
keys ``0..p``. Grouped-query attention: query head ``h`` reads kv head ``h // (Hq // Hkv)``.

Exactness (DESIGN.md §3): keys are visited in fixed 64-key tiles from position 0 with an online
softmax, queries sit in 64-row tiles aligned to absolute positions, and every matmul is a
fixed-shape ``bmm``. A query's output therefore does not depend on how many queries came with it,
on how the prefix was split between cache and new tokens, or on the rest of the batch: a decode
step computes exactly what the same row computes inside a prefill.

Packed layout: q [Tq, Hq, D], k/v [Tk, Hkv, D], offsets ``cu_seqlens_q`` / ``cu_seqlens_k``.

Paged layout (what the kernels in ``triton.py`` read): a cache [n_pages, page_size, Hkv, D] per
layer and a page table [B, max_pages]; ``gather_pages`` is its specification.
"""

from __future__ import annotations

import torch

from mini_engine.ops.invariant import bmm

__all__ = ["TILE", "attention_with_prefix", "gather_pages"]

TILE = 64


def _tiles(x: torch.Tensor, first_block: int, last_block: int, offset: int, heads: int) -> torch.Tensor:
    """Rows of x (absolute positions offset..) placed into zero-padded tiles [n, heads, TILE, D]."""
    n_tiles = last_block - first_block + 1
    padded = x.new_zeros(n_tiles * TILE, heads, x.shape[-1])
    start = offset - first_block * TILE
    padded[start : start + x.shape[0]] = x.repeat_interleave(heads // x.shape[1], dim=1)
    return padded.reshape(n_tiles, TILE, heads, -1).transpose(1, 2).contiguous()


def gather_pages(*, cache: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Positions ``0 .. seq_lens[b] - 1`` of every sequence b, packed: [sum(seq_lens), Hkv, D].

    Position p of sequence b lives at ``cache[page_table[b, p // page_size], p % page_size]``.
    """
    page_size = cache.shape[1]
    rows = []
    for b, n_keys in enumerate(seq_lens.tolist()):
        positions = torch.arange(n_keys, device=cache.device)
        pages = page_table[b].to(device=cache.device, dtype=torch.long)[positions // page_size]
        rows.append(cache[pages, positions % page_size])
    return torch.cat(rows) if rows else cache.new_zeros(0, *cache.shape[2:])


def attention_with_prefix(
    *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, scale: float | None = None,
) -> torch.Tensor:
    """Returns the attention output [Tq, Hq, D] (float32)."""
    hq, head_dim = q.shape[1], q.shape[2]
    if k.shape != v.shape or k.shape[2] != head_dim or hq % k.shape[1]:
        raise ValueError(f"k, v must be [Tk, Hkv, {head_dim}] with Hq={hq} a multiple of Hkv; got {tuple(k.shape)}")
    scale = head_dim**-0.5 if scale is None else scale
    q, k, v = q.float(), k.float(), v.float()
    q_tiles, q_pos, q_block, q_seq, k_tiles, v_tiles, k_first, k_len = [], [], [], [], [], [], [], []
    n_seq = cu_seqlens_q.numel() - 1
    for s in range(n_seq):
        q_lo, q_hi = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        k_lo, k_hi = int(cu_seqlens_k[s]), int(cu_seqlens_k[s + 1])
        n_q, n_k = q_hi - q_lo, k_hi - k_lo
        if n_q > n_k:
            raise ValueError(f"sequence {s}: {n_q} queries but only {n_k} keys (queries are the last positions)")
        if n_q == 0:
            continue
        first, last = (n_k - n_q) // TILE, (n_k - 1) // TILE
        tiles = _tiles(q[q_lo:q_hi], first, last, n_k - n_q, hq)
        positions = torch.arange(first * TILE, (last + 1) * TILE, device=q.device).reshape(-1, TILE)
        q_tiles.append(tiles)
        q_pos.append(positions.clamp(max=n_k - 1))  # padding rows attend like the last real row: no empty softmax
        q_block.append(torch.arange(first, last + 1, device=q.device))
        q_seq.append(torch.full((last - first + 1,), len(k_first), device=q.device))
        k_first.append(sum(t.shape[0] for t in k_tiles))
        k_len.append(n_k)
        k_tiles.append(_tiles(k[k_lo:k_hi], 0, last, 0, hq))
        v_tiles.append(_tiles(v[k_lo:k_hi], 0, last, 0, hq))
    out = q.new_zeros(q.shape)
    if not q_tiles:
        return out
    qt, pos, block, seq = torch.cat(q_tiles), torch.cat(q_pos), torch.cat(q_block), torch.cat(q_seq)
    kt, vt, k_first_t, k_len_t = (torch.cat(k_tiles), torch.cat(v_tiles), torch.tensor(k_first, device=q.device),
                                    torch.tensor(k_len, device=q.device))
    n_tiles = qt.shape[0]
    running_max = qt.new_full((n_tiles, hq, TILE, 1), float("-inf"))
    denom = qt.new_zeros((n_tiles, hq, TILE, 1))
    acc = qt.new_zeros(qt.shape)
    for t in range(int(block.max()) + 1):
        active = torch.nonzero(block >= t).flatten()
        kid = k_first_t[seq[active]] + t
        key_pos = torch.arange(t * TILE, (t + 1) * TILE, device=q.device)
        hidden = (key_pos[None, None, :] > pos[active][:, :, None]) | (key_pos[None, None, :] >= k_len_t[seq[active]][:, None, None])
        scores = bmm(qt[active], kt[kid].transpose(-1, -2)) * scale
        scores = scores.masked_fill(hidden[:, None], float("-inf"))
        new_max = torch.maximum(running_max[active], scores.amax(-1, keepdim=True))
        rescale = torch.exp(running_max[active] - new_max)
        probs = torch.exp(scores - new_max)
        denom[active] = denom[active] * rescale + probs.sum(-1, keepdim=True)
        acc[active] = acc[active] * rescale + bmm(probs, vt[kid])
        running_max[active] = new_max
    result = acc / denom  # [n_tiles, Hq, TILE, D]
    rows = result.transpose(1, 2).reshape(-1, hq, head_dim)
    cursor = 0
    for s in range(n_seq):
        q_lo, q_hi = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        n_q, n_k = q_hi - q_lo, int(cu_seqlens_k[s + 1] - cu_seqlens_k[s])
        if n_q == 0:
            continue
        first, last = (n_k - n_q) // TILE, (n_k - 1) // TILE
        start = cursor + (n_k - n_q) - first * TILE
        out[q_lo:q_hi] = rows[start : start + n_q]
        cursor += (last - first + 1) * TILE
    return out
