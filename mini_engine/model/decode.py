"""The decode step on the engine's pools: one token per sequence, every state read and written in place.

``HybridModel.forward`` is the specification: it takes each sequence's state as tensors, returns the
advanced state, and the runner copies it back into the pools. That is one gather and one scatter of
the whole state per sequence and layer, a host round trip per sequence, and the KV of the whole
prefix re-read through Python. ``decode_step`` computes the same step with the Triton kernels,
straight on the pools, in a fixed number of launches per layer whatever the batch (about a dozen):

- projections: the residual stream is kept as float32 rows padded to the gemm tile (``inv.ROW_TILE``),
  the projections that read the same rows are fused into one weight (``DecodeModel``), and the
  norms, gates, RoPE and activations around them are one per-row kernel each
  (``mini_engine.ops.decode_rows``), writing the next gemm's input in the weight's dtype; where a
  Triton gemm splits K for a projection the residual's norm reads (a mixer's output, the MLP's down
  projection: ``DecodeModel.delta``), that norm adds the float32 parts (no launch of their own);
- conv: ``causal_conv1d_update``'s arithmetic on the slot's conv rows, in place, in the same launch as the
  Gated DeltaNet's prepared row (``conv_gdn_rows``);
- Gated DeltaNet, on the state as it is kept (``mini_engine.model.state``: the recurrent state at
  the last 64-boundary and the prepared rows since): ``pending_replay_decode_triton`` replays the
  slot's pending rows and the new row from the boundary state in registers and reads the new
  token's output. The new row joins the slot's pending rows, or, when it completes the chunk, the
  kernel writes the state at the new boundary into the slot. With the pools' running copy
  (``Pools.run``) a step that follows a step on the same slot starts from the state the last one
  left there: one row instead of up to 64, the same bits. (The recurrent rule, not the chunked
  one: the same value to rounding, at one program per sequence and head whatever the chunk's fill.)
  ``DecodeModel(gdn="fused")`` runs the conv, the replay and the output norm as one launch per layer
  (``decode_rows.gdn_step``: whole-head state tiles) instead of three; ``gdn="two"`` the replay and the norm as
  one (each value head's norm made by the last of its V tiles' programs to finish), the same bits as three.
- attention: the new K/V written into the pages of the *resident* page table the caller passes
  (what the device holds, stale or not) by the launch that norms and rotates them (``qk_norm_rope``),
  then paged decode attention over those pages, its output gate applied as it stores.

Only the greedy argmax is left to the caller.

Nothing in the step reads the device from the host or sizes a tensor by a value, so on CUDA
``DecodeGraphs`` captures it once per batch size and replays it: a step costs a few copies and one
graph launch on the host instead of hundreds of kernel launches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from mini_engine.constants import DECODE_GEMMS, GDN_STEPS, SPLIT_SUMS, SWIGLU_STEPS
from mini_engine.device import upload
from mini_engine.model.config import LINEAR, SNAPSHOT_ALIGN
from mini_engine.ops import invariant as inv
from mini_engine.ops import pdl
from mini_engine.ops.decode_rows import gemm as gemm_ops
from mini_engine.ops.decode_rows import triton as row_ops
from mini_engine.ops.decode_rows import tuned as tuned_gemms
from mini_engine.ops.decode_rows.gdn_prepare import conv_gdn_rows
from mini_engine.ops.decode_rows.gdn_step import gdn_step
from mini_engine.ops.decode_rows.prologue import decode_prologue

__all__ = ["DecodeGraphs", "DecodeModel", "Pools", "decode_step", "step_inputs"]

SINK = 0  # the padding slot: it receives the pending rows nobody keeps


class Pools(NamedTuple):
    """The engine's device pools, as ``StateStorage`` and ``KVStorage`` lay them out."""

    conv: torch.Tensor  # [slots, L_linear, conv_dim, W - 1]
    rec: torch.Tensor  # [slots, L_linear, Hv, K, V]
    pending: torch.Tensor  # [slots, L_linear, 63, pending_width]
    keys: torch.Tensor  # [pages, L_full, page_size, Hkv, D]
    values: torch.Tensor
    run: torch.Tensor | None = None  # [slots, L_linear, Hv, K, V]: the running copy (StateStorage(running=True))
    run_rows: torch.Tensor | None = None  # [slots, L_linear, 2] int32: the rows it follows, by parity; -1: none


class _Step(NamedTuple):
    """One step's per-sequence indices, derived on the device from the uploaded ``[3, B]`` inputs and the page
    table (so a CUDA graph replays them from static buffers), once per step for every layer: the rows of
    ``decode_prologue``'s index tensor (``INDEX_FIELDS``, these fields in this order)."""

    slots: torch.Tensor  # [B] long: live slot
    positions: torch.Tensor  # [B] long: absolute position of the token fed
    rows: torch.Tensor  # [B] long: the token's row in its chunk (position % 64)
    pending_slots: torch.Tensor  # [B] long: its slot if the token joins the pending rows, else the sink
    pending_rows: torch.Tensor  # [B] long: where the new row goes in that slot (row 62 of the sink when complete)
    seq_lens: torch.Tensor  # [B] long: keys after this token (position + 1)
    kv_rows: torch.Tensor  # [B] long: the new key's row in the flattened pages (page * page_size + offset)


def step_inputs(slots: list[int], positions: list[int], extra: list[int] | None = None) -> torch.Tensor:
    """The host ``[3, B]`` long tensor a step uploads: slots, positions, and where the new pending row goes
    (the slot, or the sink when the token completes its chunk and the slot keeps no pending row); with ``extra``
    (B ints: ``DecodeGraphs(after=)``'s) a fourth row."""
    if not len(slots) == len(positions):
        raise ValueError(f"one position per slot; got {len(slots)} slots and {len(positions)} positions")
    if SINK in slots or len(set(slots)) != len(slots):
        raise ValueError(f"decode_step needs distinct live slots other than the sink {SINK}; got {slots}")
    complete = [p % SNAPSHOT_ALIGN == SNAPSHOT_ALIGN - 1 for p in positions]
    rows = [slots, positions, [SINK if c else s for s, c in zip(slots, complete)]]
    return torch.tensor(rows if extra is None else [*rows, extra], dtype=torch.long)


class _LayerWeights(NamedTuple):
    """A layer's projections that read the same rows, fused into one weight (rows concatenated)."""

    in_proj: torch.Tensor  # GDN: qkv | z | b | a;  attention: q (with its gates) | k | v
    gate_up: torch.Tensor  # the MLP's gate | up
    block: int | None  # gate_up's rows: gate and up alternate in blocks of this many (``FusedProjection(block=)``)


class DecodeModel:
    """A model as the decode step reads it: per layer, the projections that share an input fused into one
    weight (one gemm instead of four), next to the model's own modules for everything else. The fused
    weights are the model's ``FusedProjection``s as they are at construction (copies of the parts, in the
    model's weight dtype and on its device, shared with the Triton prefill)."""

    def __init__(self, model, *, gemm: str = "cublas", gdn: str = "split", pdl: bool = False,
                 gemm_table: dict | None = None, split_sums: str = "norm", swiglu: str = "gemm") -> None:
        if gemm not in DECODE_GEMMS:
            raise ValueError(f"gemm must be one of {DECODE_GEMMS}; got {gemm!r}")
        if split_sums not in SPLIT_SUMS:
            raise ValueError(f"split_sums must be one of {SPLIT_SUMS}; got {split_sums!r}")
        if swiglu not in SWIGLU_STEPS:
            raise ValueError(f"swiglu must be one of {SWIGLU_STEPS}; got {swiglu!r}")
        if gemm_table is not None and gemm != "tuned":
            raise ValueError(f"a gemm table is read by gemm='tuned' alone; got gemm={gemm!r}")
        if gdn not in GDN_STEPS:
            raise ValueError(f"gdn must be one of {GDN_STEPS}; got {gdn!r}")
        self.model = model
        self.gdn = gdn  # a GDN layer between its projections: three launches ("split"), two ("two") or one ("fused")
        self.pdl = pdl  # the step's Triton kernels as programmatic dependent launches (``ops.pdl``; sm_90 on)
        self.split_sums = split_sums  # who adds a split gemm's K parts that the residual's norm reads (``delta``)
        self.swiglu = swiglu  # where the MLP's SiLU(gate) * up runs (``mlp``)
        self.layers = [_fuse(layer) for layer in model.model.layers]
        self.norm_eps = model.model.norm.eps
        self._gemms: dict[int, gemm_ops.GemmConfig] = {}  # id(weight) -> its Triton gemm; absent: inv.linear
        deltas = {id(weight) for weight in self.deltas()} if split_sums == "norm" else set()
        for weight in self.projections():
            if gemm == "cublas" or weight.dtype not in (torch.float16, torch.bfloat16):
                continue
            if gemm == "triton":
                config = gemm_ops.configs(*weight.shape)[0]
            elif gemm == "tuned":
                config = tuned_gemms.tuned(weight, gemm_table)  # (None: the package's table)
            else:
                config = gemm_ops.choose(weight, unsummed=id(weight) in deltas) if weight.is_cuda else None
            if config is not None:
                self._gemms[id(weight)] = config

    def projections(self) -> list[torch.Tensor]:
        """Every weight the step multiplies: the head, then per layer its fused input projection, its mixer's output
        projection, the MLP's fused gate | up and its down projection."""
        out = [self.model.head_weight]
        for layer, weights in zip(self.model.model.layers, self.layers):
            out += [weights.in_proj, _mixer_out(layer), weights.gate_up, layer.mlp.down_proj.weight]
        return out

    def deltas(self) -> list[torch.Tensor]:
        """The weights whose outputs only the residual stream's norm reads (``delta``): per layer its mixer's output
        projection and the MLP's down projection."""
        return [w for layer in self.model.model.layers for w in (_mixer_out(layer), layer.mlp.down_proj.weight)]

    def linear(self, x: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
        """A projection of the step's padded rows (``rows`` live): ``inv.linear`` (cuBLAS in 64-row tiles), or
        the Triton decode gemm chosen for this weight at construction (``gemm``: "triton" for every 16-bit
        weight, "auto" where it timed faster on the device, "tuned" where the table says it did). The
        choice is per weight, never per batch, so a row's bits do not depend on the batch."""
        config = self._gemms.get(id(weight))
        if config is None:
            return inv.linear(x, weight)
        return gemm_ops.linear(x, weight, rows=rows, config=config)

    def delta(self, x: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor | row_ops.Parts:
        """``linear`` for a projection that only the residual stream's next ``add_rms_norm`` reads (a mixer's output,
        the MLP's down projection): with ``split_sums="norm"`` a Triton gemm that splits K leaves its parts to that
        norm (``row_ops.Parts``), which adds them as the gemm's second launch would (the same bits, one launch a
        projection fewer)."""
        config = self._gemms.get(id(weight))
        if config is None:
            return inv.linear(x, weight)
        return gemm_ops.linear(x, weight, rows=rows, config=config, unsummed=self.split_sums == "norm")

    def mlp(self, x: torch.Tensor, weights: _LayerWeights, rows: int, out_dtype: torch.dtype) -> torch.Tensor:
        """SiLU(gate) * up of the step's padded rows (``rows`` live) for the down projection, in ``out_dtype``: the
        gate | up projection (``linear``) then ``silu_mul``'s launch, or with ``swiglu="gemm"`` the gemm's own launch
        where its Triton tile holds a block of gate rows and of up rows (``gemm.fuses_swiglu``): the same bits."""
        config = self._gemms.get(id(weights.gate_up))
        if self.swiglu == "gemm" and gemm_ops.fuses_swiglu(config, weights.gate_up, weights.block):
            return gemm_ops.swiglu(x, weights.gate_up, rows=rows, config=config, block=weights.block,
                                   out_dtype=out_dtype)
        return row_ops.silu_mul(gate_up=self.linear(x, weights.gate_up, rows), out_dtype=out_dtype, live=rows,
                                block=weights.block)


def _mixer_out(layer) -> torch.Tensor:
    """The layer's mixer's output projection's weight: the GDN's ``out_proj`` or attention's ``o_proj``."""
    return (layer.linear_attn.out_proj if layer.layer_type == LINEAR else layer.self_attn.o_proj).weight


def _fuse(layer) -> _LayerWeights:
    """The layer's fused projections (``FusedProjection``): the same tensors the Triton prefill multiplies by."""
    in_proj = layer.linear_attn.in_proj if layer.layer_type == LINEAR else layer.self_attn.qkv
    return _LayerWeights(in_proj.weight(), layer.mlp.gate_up.weight(), layer.mlp.gate_up.block)


@torch.no_grad()
def decode_step(model: DecodeModel, pools: Pools, tokens: torch.Tensor, slots: list[int], positions: list[int],
                page_table: torch.Tensor) -> torch.Tensor:
    """Feed ``tokens`` [B] (device ids) to the sequences in live ``slots`` at ``positions``; returns the
    logits [B, vocab] (float32) and leaves every slot and page advanced by one token.

    ``page_table`` [B, max_pages] int32 on the device: row b maps sequence b's positions to pages.
    Slots must be distinct and not the sink; each sequence's position must be its state's length."""
    if not len(slots) == len(positions) == tokens.shape[0] == page_table.shape[0]:
        raise ValueError(f"decode_step needs one slot, position, token and page-table row per sequence; got "
                         f"{len(slots)}, {len(positions)}, {tokens.shape[0]}, {page_table.shape[0]}")
    host = step_inputs(slots, positions)
    _check_width(positions, page_table, pools.keys.shape[2])
    return _decode(model, pools, tokens, upload(host, tokens.device), page_table)


def _check_width(positions: list[int], page_table: torch.Tensor, page_size: int) -> None:
    """Every position's page must be in its table row (the step reads it there, unchecked, on the device)."""
    if positions and max(positions) // page_size >= page_table.shape[1]:
        raise ValueError(f"position {max(positions)} needs page {max(positions) // page_size} but the page table has "
                         f"{page_table.shape[1]} columns (page_size {page_size})")


def _decode(dm: DecodeModel, pools: Pools, tokens: torch.Tensor, inputs: torch.Tensor, page_table: torch.Tensor,
            *, by_slot: bool = False) -> torch.Tensor:
    """The step on device tensors alone: no host read, no shape that depends on values (graph-capturable).
    ``tokens``: [B], or with ``by_slot`` the per-slot next-token pool, read at the step's slots.

    The residual stream ``x`` is float32 [P, hidden], P the batch rounded up to the gemm tile, padding rows
    zero: every projection is then one fixed-shape gemm per tile on the rows as they are. The sequence ops
    (conv, the delta rule, attention) read and write the batch's own rows only."""
    with pdl.launches(dm.pdl):
        return _layers(dm, pools, tokens, inputs, page_table, by_slot)


def _layers(dm: DecodeModel, pools: Pools, tokens: torch.Tensor, inputs: torch.Tensor, page_table: torch.Tensor,
            by_slot: bool) -> torch.Tensor:
    model, n = dm.model, inputs.shape[1]
    x, index = decode_prologue(inputs=inputs, page_table=page_table, page_size=pools.keys.shape[2],
                               align=SNAPSHOT_ALIGN, tokens=tokens, embedding=model.model.embed_tokens.weight,
                               rows=-(-n // inv.ROW_TILE) * inv.ROW_TILE, by_slot=by_slot)
    step = _Step(*index)
    delta = None
    lin = full = 0
    for layer, weights in zip(model.model.layers, dm.layers):
        h = row_ops.add_rms_norm(x=x, delta=delta, weight=layer.input_layernorm.weight, eps=layer.input_layernorm.eps,
                                 out_dtype=weights.in_proj.dtype, live=n)
        if layer.layer_type == LINEAR:
            delta = _linear_attention(dm, layer.linear_attn, weights.in_proj, h, pools, lin, step, n)
            lin += 1
        else:
            delta = _full_attention(dm, layer.self_attn, weights.in_proj, h, pools, full, step, page_table, n)
            full += 1
        norm = layer.post_attention_layernorm
        h = row_ops.add_rms_norm(x=x, delta=delta, weight=norm.weight, eps=norm.eps, out_dtype=weights.gate_up.dtype,
                                 live=n)
        act = dm.mlp(h, weights, n, out_dtype=layer.mlp.down_proj.weight.dtype)
        delta = dm.delta(act, layer.mlp.down_proj.weight, n)
    head = model.head_weight
    h = row_ops.add_rms_norm(x=x, delta=delta, weight=model.model.norm.weight, eps=dm.norm_eps, out_dtype=head.dtype,
                             live=n)
    return dm.linear(h, head, n)[:n].float()


class DecodeGraphs:
    """``decode_step`` replayed from CUDA graphs, one per batch size: the first step of a size runs eagerly
    (compiling the kernels), the next captures the step into a graph, and every later step of that size
    copies its inputs, page table and tokens into the graph's static buffers and replays it.

    A replay reads and writes the pools like the eager step and reads the page-table rows when the copy
    runs (stale ones included). ``max_graphs`` bounds the sizes kept; further sizes run eagerly.

    A step also picks each sequence's greedy token on the device and stores it as its slot's next token (a sampled
    sequence's token is the caller's to draw and store over it), and returns its results as one block laid out as a
    batch's results rows (``runner.Batch``): row b the greedy token of sequence b and its logits' check (0 without
    ``after``), then ``after``'s rows; one copy moves a step's results where the batch reads them.

    ``after(inputs, page_table, logits)``: more device work run with each step and captured in its graph (the
    ledger's digests of what the step wrote and read: ``runner.ModelRunner``), returning the logits' checks [B]
    int64 and rows [k, 2] int64 for the block. ``inputs`` is the step's uploaded ``[4, B]`` long tensor:
    ``step_inputs``' three rows and a fourth, the ``extra`` ints each call passes; ``page_table`` the rows the step
    read. Graph-capturable like the step."""

    def __init__(self, model: DecodeModel, pools: Pools, next_token: torch.Tensor, *, max_graphs: int = 16,
                 after: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None
                 = None) -> None:
        self.model, self.pools, self.next_token, self.max_graphs = model, pools, next_token, max_graphs
        self.after = after
        self._graphs: dict[int, tuple] = {}
        self._seen: set[int] = set()
        self._pool = None
        self.replays = self.captures = 0

    def sizes(self) -> list[int]:
        """The batch sizes with a captured graph."""
        return sorted(self._graphs)

    @torch.no_grad()
    def __call__(self, slots: list[int], positions: list[int], page_table: torch.Tensor,
                 extra: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, vocab] of one step and its results block [B + k, 2] int64 (the class's docstring; static
        buffers when replayed: read them before the next step of B). ``extra``: B ints for ``after`` (required
        with it)."""
        n = len(slots)
        if self.after is not None and (extra is None or len(extra) != n):
            raise ValueError(f"DecodeGraphs(after=...) needs one extra int per sequence; got {extra!r} for {n}")
        host = step_inputs(slots, positions, extra if self.after is not None else None)
        _check_width(positions, page_table, self.pools.keys.shape[2])
        inputs = upload(host, self.next_token.device)
        if n in self._graphs:
            graph, static_inputs, static_table, outputs = self._graphs[n]
            static_inputs.copy_(inputs)
            static_table.copy_(page_table)
            graph.replay()
            self.replays += 1
            return outputs
        if n in self._seen and len(self._graphs) < self.max_graphs:
            return self._capture(n, inputs, page_table)
        self._seen.add(n)
        return self._step(inputs, page_table)

    def _step(self, inputs: torch.Tensor, page_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = _decode(self.model, self.pools, self.next_token, inputs[:3], page_table, by_slot=True)
        greedy = logits.argmax(-1)
        self.next_token.index_copy_(0, inputs[0], greedy)
        if self.after is None:
            return logits, torch.stack([greedy, torch.zeros_like(greedy)], 1)
        checks, rows = self.after(inputs, page_table, logits)
        return logits, torch.cat([torch.stack([greedy, checks], 1), rows])

    def _capture(self, n: int, inputs: torch.Tensor, page_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        static_inputs, static_table = inputs.clone(), page_table.clone()
        graph = torch.cuda.CUDAGraph()
        torch.cuda.current_stream().synchronize()  # capture runs on a side stream: the inputs must be there
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            outputs = self._step(static_inputs, static_table)
        self._pool = graph.pool()
        self._graphs[n] = (graph, static_inputs, static_table, outputs)
        self.captures += 1
        graph.replay()  # capturing ran nothing: this is the step
        self.replays += 1
        return outputs


def _linear_attention(dm: DecodeModel, gdn, in_proj: torch.Tensor, h: torch.Tensor, pools: Pools, layer: int,
                      step: _Step, n: int) -> torch.Tensor | row_ops.Parts:
    from mini_engine.ops.gated_delta_rule.triton_decode import pending_replay_decode_triton

    proj = dm.linear(h, in_proj, n)  # [P, qkv | z | b | a]
    conv_dim = 2 * gdn.key_dim + gdn.value_dim
    z, b, a = proj[:, conv_dim:].split([gdn.value_dim, gdn.hv, gdn.hv], dim=-1)
    pending = pools.pending[:, layer]
    running = {} if pools.run is None else {"run_pool": pools.run[:, layer], "run_rows": pools.run_rows[:, layer]}
    if dm.gdn == "fused":  # the three launches below as one (``gdn_step``)
        gated = gdn_step(x=proj[:n, :conv_dim], conv_weight=gdn.conv1d.weight[:, 0], conv_pool=pools.conv[:, layer],
                         slots=step.slots, a=a, b=b, A_log=gdn.A_log, dt_bias=gdn.dt_bias, heads=(gdn.hk, gdn.hv),
                         head_dims=(gdn.dk, gdn.dv), pending_pool=pending, pending_slots=step.pending_slots,
                         pending_rows=step.pending_rows, rec_pool=pools.rec[:, layer], rows=step.rows, z=z,
                         norm_weight=gdn.norm.weight, eps=gdn.norm.eps, out_rows=h.shape[0],
                         out_dtype=gdn.out_proj.weight.dtype, **running)
        return dm.delta(gated, gdn.out_proj.weight, n)
    # the conv on the slots' conv rows in place, and the prepared row; the new row also joins its slot's pending
    # rows (a row that completes its chunk goes to the sink's row 62)
    row = conv_gdn_rows(x=proj[:n, :conv_dim], conv_weight=gdn.conv1d.weight[:, 0], conv_pool=pools.conv[:, layer],
                        slots=step.slots, a=a, b=b, A_log=gdn.A_log, dt_bias=gdn.dt_bias, heads=(gdn.hk, gdn.hv),
                        head_dims=(gdn.dk, gdn.dv), pending_pool=pending, pending_slots=step.pending_slots,
                        pending_rows=step.pending_rows)
    # (the kernel reads the slot's rows before the new one: the row just stored is past them)
    replay = dict(new_rows=row, pending_pool=pending, rec_pool=pools.rec[:, layer], slots=step.slots, rows=step.rows,
                  heads=(gdn.hk, gdn.hv), **running)
    if dm.gdn == "two":  # the output norm in the replay's launch
        gated = pending_replay_decode_triton(**replay, z=z, norm_weight=gdn.norm.weight, eps=gdn.norm.eps,
                                             out_rows=h.shape[0], out_dtype=gdn.out_proj.weight.dtype)
    else:
        gated = row_ops.gated_rms_norm(core=pending_replay_decode_triton(**replay), z=z, weight=gdn.norm.weight,
                                       eps=gdn.norm.eps, rows=h.shape[0], out_dtype=gdn.out_proj.weight.dtype)
    return dm.delta(gated, gdn.out_proj.weight, n)


def _full_attention(dm: DecodeModel, attn, in_proj: torch.Tensor, h: torch.Tensor, pools: Pools, layer: int,
                    step: _Step, page_table: torch.Tensor, n: int) -> torch.Tensor | row_ops.Parts:
    from mini_engine.ops.attention.triton import paged_decode_attention

    qkv = dm.linear(h, in_proj, n)  # [P, q and gates | k | v]
    keys, values = pools.keys[:, layer], pools.values[:, layer]
    # the new key and value also go into their page rows in the same launch
    q, _, _ = row_ops.qk_norm_rope(qkv=qkv, batch=n, positions=step.positions, q_weight=attn.q_norm.weight,
                                   k_weight=attn.k_norm.weight, inv_freq=attn.rotary.frequencies(qkv.device),
                                   eps=attn.q_norm.eps, heads=(attn.hq, attn.hkv), head_dim=attn.d, k_cache=keys,
                                   v_cache=values, kv_rows=step.kv_rows)
    # the split grid spans the table's capacity (not this step's longest sequence): a fixed launch per batch size;
    # the output gate (per query head, the d channels after its query's) is applied as the rows are stored
    gate = qkv[:n, : attn.hq * 2 * attn.d].unflatten(1, (attn.hq, 2 * attn.d))[..., attn.d :]
    gated = paged_decode_attention(q=q, k_cache=keys, v_cache=values, page_table=page_table, seq_lens=step.seq_lens,
                                   gate=gate, rows=h.shape[0], out_dtype=attn.o_proj.weight.dtype)
    return dm.delta(gated, attn.o_proj.weight, n)
