"""The decode step's prologue in one launch: its per-sequence indices and its padded residual rows.

A step uploads ``[3, B]`` longs (slots, positions, the pending slot: ``model.decode.step_inputs``). Every
layer then needs the same few indices derived from them and the page table, and the first layer needs
each sequence's token embedded into the float32 residual rows, padded with zeros to the gemm tile. In
torch that is about fifteen small launches a step (the index arithmetic, a gather, an embedding, a
zero fill, a copy, a token gather); here it is one, and ``reference.decode_prologue`` is its
specification.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_engine.ops import pdl

__all__ = ["INDEX_FIELDS", "decode_prologue"]

# the rows of the index tensor, in order (``model.decode._Step``'s fields)
INDEX_FIELDS = ("slots", "positions", "rows", "pending_slots", "pending_rows", "seq_lens", "kv_rows")


# One compile for every batch size: the inputs' row stride is the batch (1 would be a constant, 16 a multiple).
@triton.jit(do_not_specialize=["batch", "inputs_stride"])
def _prologue_kernel(inputs, inputs_stride, batch, table, table_stride, tokens, embed, embed_stride, x, x_stride,
                     index, hidden, PAGE: tl.constexpr, ALIGN: tl.constexpr, BY_SLOT: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, column block): row r's embedding columns (zeros past the batch); block 0 also row r's indices."""
    pdl.begin(PDL)
    r, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    ok = cols < hidden
    if r < batch:
        slot = tl.load(inputs + r).to(tl.int64)
        position = tl.load(inputs + inputs_stride + r).to(tl.int64)
        if BY_SLOT:
            token = tl.load(tokens + slot).to(tl.int64)
        else:
            token = tl.load(tokens + r).to(tl.int64)
        row = tl.load(embed + token * embed_stride + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(x + r * x_stride + cols, row, mask=ok)
        if block == 0:
            chunk_row = position % ALIGN
            page = tl.load(table + r * table_stride + position // PAGE).to(tl.int64)
            tl.store(index + r, slot)
            tl.store(index + batch + r, position)
            tl.store(index + 2 * batch + r, chunk_row)
            tl.store(index + 3 * batch + r, tl.load(inputs + 2 * inputs_stride + r).to(tl.int64))
            tl.store(index + 4 * batch + r, tl.minimum(chunk_row, ALIGN - 2))
            tl.store(index + 5 * batch + r, position + 1)
            tl.store(index + 6 * batch + r, page * PAGE + position % PAGE)
    else:
        tl.store(x + r * x_stride + cols, tl.zeros([BLOCK], dtype=tl.float32), mask=ok)


def decode_prologue(*, inputs: torch.Tensor, page_table: torch.Tensor, page_size: int, align: int,
                    tokens: torch.Tensor, embedding: torch.Tensor, rows: int,
                    by_slot: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """As ``reference.decode_prologue``: ``inputs`` [3, B] (slots, positions, pending slots) on the device,
    ``page_table`` [B, pages] int32, ``tokens`` [B] (or, ``by_slot``, a per-slot token pool read at each sequence's
    slot), ``embedding`` [vocab, hidden]. Returns (x [rows, hidden] float32, index [7, B] int64)."""
    batch = inputs.shape[1] if inputs.dim() == 2 else -1
    if inputs.dim() != 2 or inputs.shape[0] != 3 or inputs.stride(1) != 1:
        raise ValueError(f"inputs must be [3, B] with contiguous rows; got {tuple(inputs.shape)}")
    if page_table.dim() != 2 or page_table.shape[0] != batch or page_table.stride(1) != 1:
        raise ValueError(f"page_table must be [{batch}, pages] with contiguous rows; got {tuple(page_table.shape)}")
    if not by_slot and tuple(tokens.shape) != (batch,):
        raise ValueError(f"tokens must be [{batch}]; got {tuple(tokens.shape)}")
    if rows < batch or embedding.dim() != 2 or embedding.stride(1) != 1:
        raise ValueError(f"rows ({rows}) must hold the batch ({batch}) and embedding be [vocab, hidden] with "
                         f"contiguous rows; got {tuple(embedding.shape)}")
    hidden = embedding.shape[1]
    x = torch.empty(rows, hidden, dtype=torch.float32, device=embedding.device)
    index = torch.empty(len(INDEX_FIELDS), batch, dtype=torch.long, device=embedding.device)
    block = min(1024, triton.next_power_of_2(hidden))
    if rows:
        _prologue_kernel[(rows, triton.cdiv(hidden, block))](
            inputs, inputs.stride(0), batch, page_table, page_table.stride(0), tokens, embedding, embedding.stride(0),
            x, x.stride(0), index, hidden, PAGE=page_size, ALIGN=align, BY_SLOT=by_slot, BLOCK=block, **pdl.options())
    return x, index
