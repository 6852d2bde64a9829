"""Where a graphed decode step's time goes: the device against the host, and each class of the step's kernels.

The engine's batch-1 decode on the issue's model is short of 40 % of the H200's weight-bandwidth roofline (34.5 %,
session 29), and fusing kernels to cut the step's ~240 launches has twice cost more than the launch it saved (the
SwiGLU in the down projection's tiles, the one-launch GDN layer: RESULTS.md, ninth and twelfth passes). Before
another fusion, this measures what one could win at most, on the engine's own step (``gpu_engine.py``'s model,
the engine's defaults in bfloat16):

- **host or device**: the engine's decode step (``Engine.step``: scheduling, the step's upload and page-table copy,
  the graph's launch, its results' read-back) against the same step's CUDA graph replayed back to back on the
  device alone (``DecodeGraphs``' graph for the batch, between two events). Where the engine's step is longer, the
  device waits for the host (or for the engine's work outside the graph), and no kernel work shortens the step.
  ``--host-profile`` adds cProfile's table of the whole step's engine steps: where the host's time goes.
- **which kernels**: the step captured again with one class of its kernels replaced by an allocation (no launch, no
  work), each graph's replay against the whole: ``norms`` (``add_rms_norm``: 49 a step), ``swiglu``
  (``silu_mul``: 24), ``gdn`` (a GDN layer's conv and rows, replay and gated norm: 3 x 18, or with
  ``decode_gdn="fused"`` 18), ``attention`` (its norm, rope and KV write, its paged decode and the splits' merge: 3 x 6), and
  ``gemms only`` (all four). What a class's removal saves bounds what fusing it away could: a fusion still does the
  work, in some other kernel.
- **which attention launch** (``--attention-tiles 64,8,1/64 ...``): the step captured again with the decode
  attention's tile (``DecodeTile``: keys a tile, warps, stages) and keys per split replaced, each against the whole
  (the package's defaults). Its neighbours in the step (the projection's gemm before, the output projection's after,
  dependent launches all) are part of what it costs, which ``decode_attention.py``'s graph of attention launches
  alone does not see: on an H200 (session 32) that benchmark's fastest launch of a new kernel (a2a87c3, reverted) was
  2.8-6.3x faster than the kernel it replaced, and the engine decoded 14 % slower with it (829 against 963 tok/s at
  batch 1).

A step without a class computes garbage from memory nothing wrote (its logits mean nothing and nothing reads them
but the argmax); only its time is kept, and each such engine is dropped after its timing. The whole step's graph is
the engine's own, unchanged. Each engine runs ``--repeats`` rounds, each ``--replays`` replays of its graph and then
as many engine steps; a replay runs the last step's inputs again, so a round's replays and steps see the same
contexts to within its tokens (attention's time grows with the context: timed apart, the two would not compare). Each
time is the median of the rounds, next to their spread; every sequence decodes through the rounds (none finishes).
Prints a table, writes JSON. CUDA only.

Usage: ``python benchmarks/decode_anatomy.py [--batches 1 32] [--vocab 248320] [--replays 100] [--repeats 5]
[--classes whole norms ...] [--attention-tiles K,WARPS,STAGES/SPLIT ...] [--host-profile FILE] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import pstats
import statistics
import sys
import tempfile
import time
import types

import torch
from gpu_engine import (  # a sibling script: benchmarks/ is on sys.path
    VARIANTS,
    copy_bandwidth,
    prompts,
    shape_08b,
    weight_bytes,
)

import mini_engine.ops.attention.triton as attention_ops
import mini_engine.ops.gated_delta_rule.triton_decode as gdn_decode
from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.model import HybridModel, load_pretrained
from mini_engine.model import decode as decode_module
from mini_engine.model.builtin import QWEN35_VOCAB, init_weights
from mini_engine.model.loader import save_pretrained

PROMPT = 64


def _empty(rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(rows, cols, dtype=dtype, device=device)  # an allocation: no kernel, in a capture too


# each class: (where, name, stand-in) triples, the stand-in returning what the step reads of the real kernel's result.
# "rows" is the decode step's own view of the row kernels (``decode.row_ops``), which the prefill's imports do not
# see: the prefill keeps its kernels, and only the decode step loses the class.
CLASSES = {
    "norms": [("rows", "add_rms_norm", lambda *, x, out_dtype, **_: _empty(*x.shape, out_dtype, x.device))],
    "swiglu": [("rows", "silu_mul", lambda *, gate_up, out_dtype, **_: _empty(gate_up.shape[0], gate_up.shape[1] // 2,
                                                                             out_dtype, gate_up.device))],
    "gdn": [(decode_module, "conv_gdn_rows", lambda **_: None),
            (gdn_decode, "pending_replay_decode_triton",  # (with the output norm: decode_gdn="two")
             lambda *, z=None, out_rows=None, out_dtype=None, **_: None if z is None else _empty(out_rows, z.shape[1],
                                                                                                 out_dtype, z.device)),
            ("rows", "gated_rms_norm",
             lambda *, z, rows, out_dtype, **_: _empty(rows, z.shape[1], out_dtype, z.device)),
            (decode_module, "gdn_step", lambda *, z, out_rows, out_dtype, **_: _empty(out_rows, z.shape[1], out_dtype,
                                                                                      z.device))],
    "attention": [("rows", "qk_norm_rope", lambda **_: (None, None, None)),
                  (attention_ops, "paged_decode_attention",
                   lambda *, gate, rows, out_dtype, **_: _empty(rows, gate.shape[1] * gate.shape[2], out_dtype,
                                                                gate.device))],
}
CLASSES["gemms only"] = [part for name in ("norms", "swiglu", "gdn", "attention") for part in CLASSES[name]]
TILED = "attention as "  # the prefix of a step whose decode attention runs another tile and split


def attention_tile(spec: str) -> str:
    """``K,WARPS,STAGES/SPLIT`` (``--attention-tiles``) -> a step's name, its stand-in registered in CLASSES: the
    package's own decode attention with that tile and keys per split."""
    head, _, tail = spec.partition("/")
    try:
        numbers, split = [int(x) for x in head.split(",")], int(tail)
        if len(numbers) != 3 or split <= 0 or split % attention_ops.BLOCK_N:
            raise ValueError(f"three numbers before the '/', and a split that is a multiple of {attention_ops.BLOCK_N}")
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{spec!r} is not K,WARPS,STAGES/SPLIT (e.g. 64,8,1/64): {error}") from None
    name = TILED + spec
    CLASSES[name] = [(attention_ops, "paged_decode_attention",
                      functools.partial(attention_ops.paged_decode_attention, tile=attention_ops.DecodeTile(*numbers),
                                        keys_per_split=split))]
    return name


@contextlib.contextmanager
def without(name: str | None):
    """The decode step with class ``name``'s kernels stood in for by allocations (or another attention tile: TILED)
    while inside (None: the whole). ``pending_replay_decode_triton`` and ``paged_decode_attention`` serve the decode
    step alone, and ``conv_gdn_rows`` and ``gdn_step`` are replaced where the decode module names them."""
    row_ops = decode_module.row_ops
    view = types.SimpleNamespace(**{k: getattr(row_ops, k) for k in dir(row_ops) if not k.startswith("__")})
    parts = [(view if where == "rows" else where, attribute, stand_in)
             for where, attribute, stand_in in (CLASSES[name] if name else [])]
    saved = [(module, attribute, getattr(module, attribute)) for module, attribute, _ in parts]
    try:
        decode_module.row_ops = view
        for module, attribute, stand_in in parts:
            setattr(module, attribute, stand_in)
        yield
    finally:
        for module, attribute, original in saved:
            setattr(module, attribute, original)
        decode_module.row_ops = row_ops


def _microseconds(run, calls: int, *, wall: bool) -> float:
    """Microseconds a call of ``run`` over ``calls`` calls: between two events on the current stream (a graph's
    replays, which run there), or with ``wall`` by the host's clock between two device synchronisations (the
    engine's steps, which run on its own streams)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    started = time.perf_counter()
    start.record()
    for _ in range(calls):
        run()
    end.record()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e6 / calls if wall else start.elapsed_time(end) * 1e3 / calls


def _summary(times: list[float]) -> tuple[float, float]:
    return statistics.median(times), max(times) / min(times) - 1


def measure(model: HybridModel, batch: int, name: str | None, args) -> dict:
    """One engine of the defaults in bfloat16, decoding ``batch`` sequences with class ``name`` left out (None: the
    whole step): rounds of its graph replayed alone, then as many of the engine's own steps. A replay runs the last
    step's inputs again (the graph's static buffers), so each round's replays see the contexts its steps see, to
    within a round's tokens: attention's time grows with the context, and the two are compared at the same.
    With ``args.host_profile`` and the whole step, one more round of steps under cProfile (its table appended)."""
    steps = (args.repeats + 1) * args.replays + 8  # the timed steps, and a margin: no sequence finishes inside them
    config = EngineConfig(device="cuda", overlap=True, max_running=batch, num_slots=3 * batch + 8,
                          num_pages=batch * (-(-(PROMPT + steps + 16) // 16)) + 64, max_context=PROMPT + steps + 64,
                          threads=None, **VARIANTS["graphs-bf16-default"])
    with without(name):
        engine = Engine(config, model=model)
        ids = [engine.submit(p, SamplingParams(max_tokens=steps + 8)) for p in prompts(batch, PROMPT)]
        graphs = engine.runner.graphs
        while batch not in graphs.sizes() or min(engine.poll(r)[0] for r in ids) < 4:
            engine.step()
        graph = graphs._graphs[batch][0]
        first = min(engine.poll(r)[0] for r in ids)
        replays, stepped = [], []
        for _ in range(args.repeats):
            replays.append(_microseconds(graph.replay, args.replays, wall=False))
            engine.step()  # untimed: the timed steps start from a step of the engine's own, not from the replays
            stepped.append(_microseconds(engine.step, args.replays, wall=True))
        if args.host_profile and name is None:
            profiler = cProfile.Profile()
            profiler.runcall(_microseconds, engine.step, args.replays, wall=True)
            with open(args.host_profile, "a") as f:
                f.write(f"\n== batch {batch}: {args.replays} engine steps under cProfile, by own time ==\n")
                pstats.Stats(profiler, stream=f).sort_stats("tottime").print_stats(30)
        last = min(engine.poll(r)[0] for r in ids)
        assert last < steps + 8, "a sequence finished inside the timed steps"
    del engine, graphs, graph
    torch.cuda.empty_cache()
    (replay, replay_spread), (step, step_spread) = _summary(replays), _summary(stepped)
    return {"batch": batch, "without": name, "replay_us": replay, "replay_spread": replay_spread,
            "engine_step_us": step, "engine_step_spread": step_spread, "context": [PROMPT + first, PROMPT + last],
            "replay_rounds_us": replays, "engine_rounds_us": stepped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--vocab", type=int, default=QWEN35_VOCAB, help="the model's vocabulary (gpu_engine.py)")
    parser.add_argument("--replays", type=int, default=100, help="graph replays, then as many engine steps, a round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; their median is reported")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="device copy bandwidth, bytes/s (default: this GPU model's as measured: "
                             "gpu_engine.COPY_BANDWIDTH)")
    parser.add_argument("--classes", nargs="+", default=["whole", *CLASSES], choices=["whole", *CLASSES],
                        help="the steps measured: the whole, and without which classes")
    parser.add_argument("--attention-tiles", nargs="+", default=[], type=attention_tile, metavar="K,WARPS,STAGES/SPLIT",
                        help="also steps whose decode attention runs this tile and keys per split")
    parser.add_argument("--host-profile", default=None, metavar="FILE",
                        help="append cProfile's table of a round of the whole step's engine steps, per batch, here")
    parser.add_argument("--out", default="benchmarks/decode_anatomy.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_anatomy.py: needs a CUDA device (the step's CUDA graph is what it times)")
    args.bandwidth = copy_bandwidth(args.bandwidth)
    config = shape_08b(args.vocab)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(init_weights(HybridModel(config)), folder)
        model = load_pretrained(folder).cuda().cast_projections(torch.bfloat16)
    rows = []
    for batch in args.batches:
        for name in [None if c == "whole" else c for c in args.classes] + args.attention_tiles:
            started = time.perf_counter()
            rows.append(measure(model, batch, name, args))
            print(f"  batch {batch}, {name or 'whole'}: "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    device = torch.cuda.get_device_name()
    roofline_us = weight_bytes(model) / args.bandwidth * 1e6
    print(f"{device}; {config.name}, vocabulary {config.vocab_size}, bfloat16, the engine's defaults; us a step, "
          f"median of {args.repeats} x {args.replays}; the weights at {args.bandwidth / 1e12:.2f} TB/s: "
          f"{roofline_us:.0f} us")
    print(f"{'batch':>5}  {'step':<22}{'graph replay':>13}{'spread':>8}{'vs whole':>9}{'engine step':>12}{'spread':>8}"
          f"{'outside graph':>14}{'context':>11}")
    for r in rows:
        whole = next((w for w in rows if w["batch"] == r["batch"] and w["without"] is None), None)
        r["saved_share"] = None if whole is None else 1 - r["replay_us"] / whole["replay_us"]
        # of the engine's step, what its graph's replay does not account for: the device waiting for the host, or the
        # engine's own device work outside the graph (its upload and table copy, the results' read-back)
        r["outside_graph_share"] = 1 - r["replay_us"] / r["engine_step_us"]
        name = r["without"]
        label = ("whole" if name is None else name if name == "gemms only"
                 else name.removeprefix(TILED) if name.startswith(TILED) else f"without {name}")
        print(f"{r['batch']:>5}  {label:<22}{r['replay_us']:>13.1f}{r['replay_spread']:>8.1%}"
              f"{'-' if whole is None else format(-r['saved_share'], '+.1%'):>9}"
              f"{r['engine_step_us']:>12.1f}{r['engine_step_spread']:>8.1%}"
              f"{r['outside_graph_share']:>14.1%}{'{}-{}'.format(*r['context']):>11}")
    with open(args.out, "w") as f:
        json.dump({"device": device, "model": config.name, "vocab": config.vocab_size, "bandwidth": args.bandwidth,
                   "roofline_us": roofline_us, "replays": args.replays, "repeats": args.repeats, "rows": rows}, f,
                  indent=2)


if __name__ == "__main__":
    main()
