"""Float32 reference of the gated delta rule: the specification the Triton kernels are held to.

The recurrence, per value head, with state ``S`` of shape [K, V] and per-token decay ``g <= 0``::

    S_t = exp(g_t) * S_{t-1}
    S_t = S_t + k_t (beta_t * (v_t - k_t^T S_t))^T        (the delta rule: write only the error)
    o_t = S_t^T (q_t * scale)

``recurrent_gated_delta_rule`` is that loop, token by token. ``chunk_gated_delta_rule`` computes the
same thing 64 tokens at a time (the WY / UT-transform form of flash-linear-attention) and also
returns the state at the end of every full chunk: those are the x64-boundary states that the
engine writes into track snapshots.

Packed variable-length batches: tokens of all sequences are concatenated along dim 0 and
``cu_seqlens`` gives the offsets (``[0, len_0, len_0 + len_1, ...]``). Each sequence has its own
initial state. q/k heads may be fewer than v heads (grouped value attention): value head ``h``
reads q/k head ``h // (Hv // Hk)``.

Exactness contract (DESIGN.md §3): chunks start at each sequence's first token, which the caller
aligns to an absolute multiple of 64. Every matmul is a fixed-shape ``bmm`` and rows of a chunk
never read later rows, so a token's output is bit-identical whether its chunk was complete or
still being filled, and whatever other sequences share the call.
"""

from __future__ import annotations

from itertools import accumulate
from typing import NamedTuple

import torch

from mini_engine.ops.invariant import bmm

__all__ = ["CHUNK", "GdnResult", "chunk_gated_delta_rule", "recurrent_gated_delta_rule"]

CHUNK = 64


class GdnResult(NamedTuple):
    output: torch.Tensor  # [T, Hv, V]
    final_state: torch.Tensor  # [B, Hv, K, V], the state after each sequence's last token
    boundary_states: list[torch.Tensor]  # per sequence: [full chunks, Hv, K, V], state after each full chunk


def _check_inputs(q, k, v, g, beta, cu_seqlens, initial_state):
    if q.shape != k.shape or q.dim() != 3:
        raise ValueError(f"q and k must both be [T, Hk, K]; got {tuple(q.shape)} and {tuple(k.shape)}")
    total, hk, _ = q.shape
    if v.dim() != 3 or v.shape[0] != total or v.shape[1] % hk:
        raise ValueError(f"v must be [T, Hv, V] with Hv a multiple of Hk={hk}; got {tuple(v.shape)}")
    hv = v.shape[1]
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (total, hv):
            raise ValueError(f"{name} must be [T, Hv] = {(total, hv)}; got {tuple(t.shape)}")
    bounds = cu_seqlens.tolist() if cu_seqlens.dim() == 1 else None  # host ints: no tensor op per check
    if not bounds or bounds[0] != 0 or bounds[-1] != total:
        raise ValueError(f"cu_seqlens must be 1-D and run from 0 to T={total}; got {cu_seqlens.tolist()}")
    if any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must be non-decreasing; got {bounds}")
    n_seq = cu_seqlens.numel() - 1
    shape = (n_seq, hv, q.shape[2], v.shape[2])
    if initial_state is not None and tuple(initial_state.shape) != shape:
        raise ValueError(f"initial_state must be {shape}; got {tuple(initial_state.shape)}")
    return shape


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    return x.repeat_interleave(hv // x.shape[1], dim=1) if x.shape[1] != hv else x


def recurrent_gated_delta_rule(
    *, q, k, v, g, beta, cu_seqlens, initial_state=None, scale: float | None = None
) -> GdnResult:
    """Token-by-token reference (decode form). Inputs as in the module docstring; q, k already L2-normalised."""
    state_shape = _check_inputs(q, k, v, g, beta, cu_seqlens, initial_state)
    hv = v.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = _expand_heads(q.float(), hv) * scale, _expand_heads(k.float(), hv)
    v, g, beta = v.float(), g.float(), beta.float()
    out = torch.zeros_like(v)
    finals, boundaries = [], []
    for s in range(state_shape[0]):
        lo, hi = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        state = v.new_zeros(state_shape[1:]) if initial_state is None else initial_state[s].float().clone()
        seq_boundaries = []
        for t in range(lo, hi):
            state = state * torch.exp(g[t])[:, None, None]
            predicted = (state * k[t][:, :, None]).sum(-2)
            delta = (v[t] - predicted) * beta[t][:, None]
            state = state + k[t][:, :, None] * delta[:, None, :]
            out[t] = (state * q[t][:, :, None]).sum(-2)
            if (t - lo + 1) % CHUNK == 0:
                seq_boundaries.append(state.clone())
        finals.append(state)
        boundaries.append(torch.stack(seq_boundaries) if seq_boundaries else state.new_zeros(0, *state.shape))
    return GdnResult(out, torch.stack(finals) if finals else v.new_zeros(state_shape), boundaries)


def _to_chunks(x: torch.Tensor, starts: list[int], lengths: list[int]) -> torch.Tensor:
    """[T, H, ...] packed -> [chunks, H, CHUNK, ...], zero-padded, each sequence's chunks consecutive."""
    pieces = []
    for lo, n in zip(starts, lengths):
        n_chunks = -(-n // CHUNK)
        padded = x.new_zeros(n_chunks * CHUNK, *x.shape[1:])
        padded[:n] = x[lo : lo + n]
        pieces.append(padded.reshape(n_chunks, CHUNK, *x.shape[1:]).transpose(1, 2))
    return torch.cat(pieces).contiguous()


def _intra_chunk(qc, kc, vc, gc, bc):
    """Everything that depends only on one chunk: returns (u, w, intra, q_decayed, k_decayed, chunk_decay)."""
    cum = gc.cumsum(-1)  # [N, H, C] log-decay from chunk start to each row
    upper = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=gc.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    k_beta = kc * bc[..., None]
    system = bmm(k_beta, kc.transpose(-1, -2)) * decay  # strictly-lower part is the UT system
    u = torch.linalg.solve_triangular(system, vc * bc[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    intra = bmm(qc, kc.transpose(-1, -2)) * decay
    last = cum[..., -1:]
    q_decayed = qc * cum.exp()[..., None]
    k_decayed = kc * (last - cum).exp()[..., None]
    return u, w, intra, q_decayed, k_decayed, last.exp()[..., None]


def chunk_gated_delta_rule(
    *, q, k, v, g, beta, cu_seqlens, initial_state=None, scale: float | None = None
) -> GdnResult:
    """Chunked reference (prefill form) returning the state after every full 64-token chunk."""
    state_shape = _check_inputs(q, k, v, g, beta, cu_seqlens, initial_state)
    n_seq, hv = state_shape[0], state_shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    starts = cu_seqlens[:-1].tolist()
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    chunk_counts = [-(-n // CHUNK) for n in lengths]
    out = v.new_zeros(v.shape, dtype=torch.float32)
    state = v.new_zeros(state_shape, dtype=torch.float32) if initial_state is None else initial_state.float().clone()
    boundaries: list[list[torch.Tensor]] = [[] for _ in range(n_seq)]
    live = [s for s in range(n_seq) if lengths[s] > 0]
    if not live:
        return GdnResult(out, state, [state.new_zeros(0, *state_shape[1:]) for _ in range(n_seq)])
    cols = [_to_chunks(t, [starts[s] for s in live], [lengths[s] for s in live]) for t in (
        _expand_heads(q.float(), hv) * scale, _expand_heads(k.float(), hv), v.float(), g.float(), beta.float())]
    u, w, intra, q_dec, k_dec, chunk_decay = _intra_chunk(*cols)
    first_chunk = torch.tensor([0, *accumulate(chunk_counts[s] for s in live)][:-1], device=v.device)
    outputs = torch.zeros_like(u)
    for j in range(max(chunk_counts[s] for s in live)):
        active = [i for i, s in enumerate(live) if chunk_counts[s] > j]
        ids = first_chunk[active] + j
        seq_ids = torch.tensor([live[i] for i in active], device=v.device)
        s_prev = state[seq_ids]
        v_new = u[ids] - bmm(w[ids], s_prev)
        outputs[ids] = bmm(q_dec[ids], s_prev) + bmm(intra[ids], v_new)
        s_next = s_prev * chunk_decay[ids] + bmm(k_dec[ids].transpose(-1, -2), v_new)
        state[seq_ids] = s_next
        for i, s in enumerate(seq_ids.tolist()):
            if (j + 1) * CHUNK <= lengths[s]:
                boundaries[s].append(s_next[i].clone())
    for i, s in enumerate(live):
        rows = outputs[first_chunk[i] : first_chunk[i] + chunk_counts[s]].transpose(1, 2)
        out[starts[s] : starts[s] + lengths[s]] = rows.reshape(-1, hv, v.shape[2])[: lengths[s]]
    stacked = [torch.stack(b) if b else state.new_zeros(0, *state_shape[1:]) for b in boundaries]
    return GdnResult(out, state, stacked)

