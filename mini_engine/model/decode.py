"""The decode step on the engine's pools: one token per sequence, every state read and written in place.

``HybridModel.forward`` is the specification: it takes each sequence's state as tensors, returns the
advanced state, and the runner copies it back into the pools. That is one gather and one scatter of
the whole state per sequence and layer, a host round trip per sequence, and the KV of the whole
prefix re-read through Python. ``decode_step`` computes the same step with the Triton kernels,
straight on the pools, in a fixed number of launches per layer whatever the batch:

- conv: ``causal_conv1d_update`` on the slot's conv rows, in place;
- Gated DeltaNet, chunk-exact as the state is kept (``mini_engine.model.state``): each sequence's
  pending rows and its new row form one zero-padded 64-row chunk, and the chunked kernel computes it
  from the slot's recurrent state at the boundary. The new token's output is its row of that chunk;
  the new row joins the slot's pending rows, or, when it completes the chunk, the chunk's end state
  is written into the slot (the other sequences' end states go to the padding sink, slot 0);
- attention: the new K/V written into the pages of the *resident* page table the caller passes
  (what the device holds, stale or not), then paged decode attention over those pages.

Zero rows after a chunk's last real row are exactly what the kernel's masked loads produce, so the
padded chunk computes what an unpadded one would. Only the greedy argmax is left to the caller.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mini_engine.model.config import LINEAR, SNAPSHOT_ALIGN
from mini_engine.ops import invariant as inv

__all__ = ["Pools", "decode_step"]

SINK = 0  # the slot that receives the chunk-end states nobody keeps


class Pools(NamedTuple):
    """The engine's device pools, as ``StateStorage`` and ``KVStorage`` lay them out."""

    conv: torch.Tensor  # [slots, L_linear, conv_dim, W - 1]
    rec: torch.Tensor  # [slots, L_linear, Hv, K, V]
    pending: torch.Tensor  # [slots, L_linear, 63, pending_width]
    keys: torch.Tensor  # [pages, L_full, page_size, Hkv, D]
    values: torch.Tensor


class _Step(NamedTuple):
    """One step's per-sequence indices on the device, uploaded together."""

    slots: torch.Tensor  # [B] long: live slot
    positions: torch.Tensor  # [B] long: absolute position of the token fed
    rows: torch.Tensor  # [B] long: the token's row in its chunk (position % 64)
    write_rows: torch.Tensor  # [B] long: its slot if the token completes a chunk, else the sink
    keep: torch.Tensor  # [B, 63, 1] float: 1 for the pending rows that mean something
    seq_lens: torch.Tensor  # [B] int32: keys after this token (position + 1)
    cu_chunks: torch.Tensor  # host [B + 1]: one 64-row chunk per sequence
    max_len: int
    pending: list[int]  # sequences whose token joins the pending rows (the chunk is not complete)


def _plan(slots: list[int], positions: list[int], device: torch.device) -> _Step:
    rows = [p % SNAPSHOT_ALIGN for p in positions]
    complete = [r == SNAPSHOT_ALIGN - 1 for r in rows]
    write_rows = [s if c else SINK for s, c in zip(slots, complete)]
    host = torch.tensor([slots, positions, rows, write_rows], dtype=torch.long)
    slots_t, positions_t, rows_t, write_t = host.to(device, non_blocking=True).unbind(0)
    keep = (torch.arange(SNAPSHOT_ALIGN - 1, device=device)[None, :] < rows_t[:, None]).float()[..., None]
    n = len(slots)
    return _Step(slots_t, positions_t, rows_t, write_t, keep, (positions_t + 1).to(torch.int32),
                 torch.arange(0, n * SNAPSHOT_ALIGN + 1, SNAPSHOT_ALIGN), max(positions) + 1,
                 [i for i, c in enumerate(complete) if not c])


@torch.no_grad()
def decode_step(model, pools: Pools, tokens: torch.Tensor, slots: list[int], positions: list[int],
                page_table: torch.Tensor) -> torch.Tensor:
    """Feed ``tokens`` [B] (device ids) to the sequences in live ``slots`` at ``positions``; returns the
    logits [B, vocab] and leaves every slot and page advanced by one token.

    ``page_table`` [B, max_pages] int32 on the device: row b maps sequence b's positions to pages.
    Slots must be distinct and not the sink; each sequence's position must be its state's length."""
    if not len(slots) == len(positions) == tokens.shape[0] == page_table.shape[0]:
        raise ValueError(f"decode_step needs one slot, position, token and page-table row per sequence; got "
                         f"{len(slots)}, {len(positions)}, {tokens.shape[0]}, {page_table.shape[0]}")
    if SINK in slots or len(set(slots)) != len(slots):
        raise ValueError(f"decode_step needs distinct live slots other than the sink {SINK}; got {slots}")
    step = _plan(slots, positions, tokens.device)
    x = model.model.embed_tokens(tokens).float()
    lin = full = 0
    for layer in model.model.layers:
        h = layer.input_layernorm(x)
        if layer.layer_type == LINEAR:
            out = _linear_attention(layer.linear_attn, h, pools, lin, step)
            lin += 1
        else:
            out = _full_attention(layer.self_attn, h, pools, full, step, page_table)
            full += 1
        x = x + out
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return inv.linear(model.model.norm(x), model.head_weight)


def _linear_attention(gdn, h: torch.Tensor, pools: Pools, layer: int, step: _Step) -> torch.Tensor:
    from mini_engine.ops.causal_conv1d.triton import causal_conv1d_update
    from mini_engine.ops.gated_delta_rule.triton import chunk_gated_delta_rule_triton

    n = h.shape[0]
    mixed = inv.linear(h, gdn.in_proj_qkv.weight)
    conv = causal_conv1d_update(x=mixed, weight=gdn.conv1d.weight[:, 0], conv_pool=pools.conv[:, layer],
                                slot_indices=step.slots, activation="silu").output
    q, k, v = conv.split([gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
    q = inv.l2_normalize(q.reshape(-1, gdn.hk, gdn.dk)).reshape(-1, gdn.key_dim)
    k = inv.l2_normalize(k.reshape(-1, gdn.hk, gdn.dk)).reshape(-1, gdn.key_dim)
    g, beta = gdn.gates(h)
    row = torch.cat([q, k, v, g, beta], dim=-1)  # [B, pending_width]: the layout of a pending row
    pending = pools.pending[:, layer]
    chunk = torch.zeros(n, SNAPSHOT_ALIGN, row.shape[1], device=row.device, dtype=row.dtype)
    chunk[:, : SNAPSHOT_ALIGN - 1] = pending.index_select(0, step.slots) * step.keep
    batch = torch.arange(n, device=row.device)
    chunk[batch, step.rows] = row
    cq, ck, cv, cg, cbeta = gdn._split(chunk.reshape(n * SNAPSHOT_ALIGN, -1))
    result = chunk_gated_delta_rule_triton(q=cq, k=ck, v=cv, g=cg, beta=cbeta, cu_seqlens=step.cu_chunks,
                                           state_pool=pools.rec[:, layer], state_indices=step.slots,
                                           write_indices=step.write_rows)
    if step.pending:
        keep = torch.tensor(step.pending, device=row.device) if len(step.pending) < n else batch
        pending[step.slots[keep], step.rows[keep]] = row[keep]
    core = result.output.reshape(n, SNAPSHOT_ALIGN, gdn.hv, gdn.dv)[batch, step.rows]
    return gdn._output(core, inv.linear(h, gdn.in_proj_z.weight))


def _full_attention(attn, h: torch.Tensor, pools: Pools, layer: int, step: _Step,
                    page_table: torch.Tensor) -> torch.Tensor:
    from mini_engine.ops.attention.triton import paged_decode_attention, write_kv_pages

    n = h.shape[0]
    q, gate = inv.linear(h, attn.q_proj.weight).reshape(n, attn.hq, 2 * attn.d).chunk(2, dim=-1)
    q = attn.rotary(attn.q_norm(q), step.positions).contiguous()
    k = attn.rotary(attn.k_norm(inv.linear(h, attn.k_proj.weight).reshape(n, attn.hkv, attn.d)), step.positions)
    v = inv.linear(h, attn.v_proj.weight).reshape(n, attn.hkv, attn.d)
    keys, values = pools.keys[:, layer], pools.values[:, layer]
    page_size = keys.shape[1]
    pages = page_table.gather(1, (step.positions // page_size)[:, None].to(torch.long)).squeeze(1).to(torch.long)
    write_kv_pages(k_cache=keys, v_cache=values, k=k.contiguous(), v=v.contiguous(),
                   slot_mapping=pages * page_size + step.positions % page_size)
    out = paged_decode_attention(q=q, k_cache=keys, v_cache=values, page_table=page_table, seq_lens=step.seq_lens,
                                 max_seq_len=step.max_len)
    out = out.reshape(n, attn.hq * attn.d) * inv.sigmoid(gate.reshape(n, attn.hq * attn.d))
    return inv.linear(out, attn.o_proj.weight)
