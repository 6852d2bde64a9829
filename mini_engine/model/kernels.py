"""The ops of a stateful forward that have kernels, by implementation: the references or the Triton kernels.

``HybridModel.forward(kernels=...)`` picks, for the three ops that walk a sequence (the causal conv,
the chunked gated delta rule, attention over a prefix) and for the projections, either ``"reference"``
(``mini_engine.ops.*.reference`` and ``inv.linear``: any device, the specification; on a GPU it is
hundreds of small launches per layer, driven from Python, a projection one gemm per 64 rows) or
``"triton"`` (the kernels held to those references: a few launches per layer, one per projection, on a
GPU or under ``TRITON_INTERPRET=1``). Norms and activations are the same in both.

Both keep the exactness contract of DESIGN.md §3: the conv is per token, the gated delta rule's
chunks start on absolute 64-boundaries, and attention visits keys in 64-key tiles from position 0;
a program covers one sequence (and head), or one block of rows with a configuration fixed by the
weight, so a row's result does not depend on the rest of the batch.
The two give the same values to rounding, not the same bits: an engine uses one for every forward.
"""

from __future__ import annotations

import functools

import torch

from mini_engine.device import upload
from mini_engine.model.batch import PackedBatch
from mini_engine.ops.attention import attention_with_prefix
from mini_engine.ops.causal_conv1d import ConvResult, causal_conv1d
from mini_engine.ops.gated_delta_rule import GdnResult, chunk_gated_delta_rule
from mini_engine.ops.linear import linear as reference_linear

__all__ = ["KERNELS", "attention", "check_kernels", "conv", "gated_delta_rule", "linear"]

KERNELS = ("reference", "triton")


def check_kernels(kernels: str) -> None:
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}; got {kernels!r}")


def linear(kernels: str, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T``, batch-invariant (``mini_engine.ops.linear``): ``inv.linear``'s 64-row tiles, or one
    Triton launch."""
    if kernels == "triton":
        from mini_engine.ops.linear.triton import linear as linear_triton

        return linear_triton(x, weight)
    return reference_linear(x, weight)


def conv(kernels: str, *, x: torch.Tensor, weight: torch.Tensor, batch: PackedBatch,
         initial_state: torch.Tensor) -> ConvResult:
    """Depthwise causal conv with SiLU over the packed ``batch`` (``causal_conv1d``); the Triton form reads the
    batch's offsets on x's device, uploaded once for the forward."""
    if kernels == "triton":
        from mini_engine.ops.causal_conv1d.triton import causal_conv1d as conv_triton

        return conv_triton(x=x, weight=weight, cu_seqlens=batch.cu_seqlens_on(x.device), initial_state=initial_state,
                           activation="silu")
    return causal_conv1d(x=x, weight=weight, cu_seqlens=batch.cu_seqlens, initial_state=initial_state,
                         activation="silu")


def gated_delta_rule(kernels: str, *, q, k, v, g, beta, cu_seqlens: torch.Tensor,
                     initial_state: torch.Tensor) -> GdnResult:
    """The chunked gated delta rule with the state after every full chunk (``chunk_gated_delta_rule``);
    ``cu_seqlens`` on the host."""
    if kernels == "triton":
        from mini_engine.ops.gated_delta_rule.triton import chunk_gated_delta_rule_triton

        return chunk_gated_delta_rule_triton(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens,
                                             initial_state=initial_state)
    return chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, initial_state=initial_state)


def attention(kernels: str, *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch,
              cu_seqlens_k: torch.Tensor) -> torch.Tensor:
    """Causal attention of each sequence's new queries (the packed ``batch``) over its keys, packed
    (``attention_with_prefix``; the keys' offsets on the host). The Triton form reads the packed keys as a paged
    cache of one-position pages whose page table names each sequence's rows, so the same kernel serves the
    engine's pages and this; the queries' offsets on q's device, uploaded once for the forward."""
    if kernels != "triton":
        return attention_with_prefix(q=q, k=k, v=v, cu_seqlens_q=batch.cu_seqlens, cu_seqlens_k=cu_seqlens_k)
    from mini_engine.ops.attention.triton import paged_prefill_attention

    table, key_lengths = _one_position_pages(tuple(cu_seqlens_k.tolist()), q.device)
    k_pages, v_pages = (t.reshape(t.shape[0], 1, *t.shape[1:]) for t in (k, v))
    return paged_prefill_attention(q=q.contiguous(), k_cache=k_pages, v_cache=v_pages, page_table=table,
                                   cu_seqlens_q=batch.cu_seqlens_on(q.device), seq_lens=key_lengths,
                                   max_seqlen_q=max(batch.lengths))


@functools.lru_cache(maxsize=8)
def _one_position_pages(cu_seqlens_k: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The page table [B, longest] int32 (row b: sequence b's rows of the packed keys) and the key counts [B]
    on ``device``, built and uploaded once per batch layout: every attention layer of a forward shares them."""
    cu = torch.tensor(cu_seqlens_k)
    lengths = cu[1:] - cu[:-1]
    table = (cu[:-1, None] + torch.arange(int(lengths.max()))[None]).clamp(max=max(cu_seqlens_k[-1] - 1, 0))
    return upload(table.to(torch.int32), device), upload(lengths, device)
