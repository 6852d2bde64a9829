"""Engine decode throughput on one GPU: a random Qwen3.5-0.8B-shaped model against
``transformers.generate`` on the same weights and against the weight-bandwidth roofline.

Shape (the issue's): hidden 1024, 24 layers in the 3:1 pattern, 16 linear key/value heads of 128,
8 query / 2 KV attention heads of 256, intermediate 3584, over the byte tokenizer (vocabulary 260,
so the embedding and head are small and the weights are the layers'), or with ``--vocab 248320``
Qwen3.5's own vocabulary: a tied embedding and head of 0.5 GB in bfloat16, the model the issue's
roofline (1.6 GB of weights) and its transformers figures describe; the head's gemm then streams that
half gigabyte every step, and ids past the byte tokenizer render as U+FFFD. Weights are seeded
(``init_weights``), written once as a Hugging Face checkpoint and read by both engines.

The engine's decode throughput is timed inside a run of ``--long`` new tokens per sequence, from the
step where every sequence is decoding to the end (decode steps alone; the median of ``--repeats``
runs and their spread). ``transformers.generate`` cannot be stepped: its rate is a difference of two
runs, ``--short`` and ``--long`` new tokens, so prefill and start-up cancel:
``batch * (long - short) / (t_long - t_short)``. Both engines decode
greedily with end-of-sequence ignored. The roofline is one read of every weight per step at the
device copy bandwidth (``--bandwidth``; by default the GPU model's as measured: 4.17 TB/s on the H200, 3.02 on the
H100). Prints a table, writes JSON.

The engine runs once per ``--variants``, side by side: ``graphs`` (decode steps through
``model.decode``, the kernels on the pools, replayed from one CUDA graph per batch size, cuBLAS gemms and plain
launches), ``graphs-bf16`` (the same with bfloat16 projections: ``EngineConfig.dtype``),
``graphs-bf16-tgemm`` (and the projections through the Triton decode gemm: ``EngineConfig.decode_gemm``),
``graphs-bf16-auto`` (per weight shape, whichever of cuBLAS and the Triton gemm's configurations timed fastest),
``graphs-bf16-gdn1`` (each GDN layer's conv, replay and norm in one launch: ``EngineConfig.decode_gdn``),
``graphs-bf16-pdl``, ``graphs-bf16-auto-pdl`` and ``graphs-bf16-auto-pdl-gdn1`` (the step's Triton kernels as
programmatic dependent launches: ``EngineConfig.decode_pdl``; a Hopper GPU), ``graphs-bf16-default`` (the
engine's defaults: ``decode_gemm="tuned"``, the gemms measured ahead of time for this GPU model, and dependent
launches where the GPU can), ``graphs-bf16-gemm-sums`` (the defaults with a split gemm's K parts added by a launch of
its own, not by the norm that reads them: ``EngineConfig.decode_split_sums``), ``graphs-bf16-swiglu-rows`` (the
defaults with the MLP's SiLU(gate) * up in a launch of its own, not in the gate | up gemm's:
``EngineConfig.decode_swiglu``), ``graphs-bf16-gdn2`` (the defaults with each GDN layer's output norm in its replay's
launch: ``decode_gdn="two"``),
``triton`` (the step launched eagerly) and ``reference`` (through ``HybridModel.forward``). Each
row's roofline is one read of the weights in its own dtype. ``--profile FILE`` writes torch.profiler's
tables of one run per variant at ``--profile-batch`` (default the largest; where a step's time goes), and with
``--trace`` each run's timeline (``FILE.VARIANT.trace.json``, Chrome's trace format: the gaps between kernels).
``--gemm-table FILE`` adds ``graphs-bf16-table``: the defaults with that decode gemm table in the package's place (a
re-tuning, ``scripts/tune_decode_gemms.py --out FILE``, against the packaged choices in one process).

Usage: ``python benchmarks/gpu_engine.py [--batches 1 32] [--prompt 64] [--short 8] [--long 40]
[--variants graphs triton reference] [--hf-dtype float32 bfloat16] [--vocab N] [--gemm-table FILE] [--profile FILE]
[--out FILE]``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time

sys.modules.setdefault("fla", None)  # transformers' torch path, as the reference figures were measured

import torch  # noqa: E402

from mini_engine.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from mini_engine.model import HybridModel, load_pretrained  # noqa: E402
from mini_engine.model.builtin import QWEN35_08B, QWEN35_VOCAB, builtin_config, init_weights  # noqa: E402
from mini_engine.model.config import ModelConfig  # noqa: E402
from mini_engine.model.loader import save_pretrained  # noqa: E402


def shape_08b(vocab: int | None = None) -> ModelConfig:
    """The issue's shape (the built-in ``QWEN35_08B``) over the byte tokenizer's vocabulary, or ``vocab`` ids
    (``QWEN35_VOCAB``: the real model's, whose tied embedding and head make up the 1.6 GB the issue's roofline
    counts)."""
    config = builtin_config(QWEN35_08B)
    return config if vocab is None else dataclasses.replace(config, vocab_size=vocab)


def prompts(batch: int, length: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch * 1000 + length)
    return torch.randint(0, 256, (batch, length), generator=gen).tolist()


_PLAIN = {"decode_kernels": "triton", "cuda_graphs": True, "decode_gemm": "cublas", "decode_pdl": False}
_BF16 = {**_PLAIN, "dtype": "bfloat16"}
VARIANTS = {"graphs": _PLAIN,
            "graphs-bf16": _BF16,
            "graphs-bf16-tgemm": {**_BF16, "decode_gemm": "triton"},
            "graphs-bf16-auto": {**_BF16, "decode_gemm": "auto"},
            "graphs-bf16-gdn1": {**_BF16, "decode_gdn": "fused"},
            "graphs-bf16-pdl": {**_BF16, "decode_pdl": True},
            "graphs-bf16-auto-pdl": {**_BF16, "decode_gemm": "auto", "decode_pdl": True},
            "graphs-bf16-auto-pdl-gdn1": {**_BF16, "decode_gemm": "auto", "decode_pdl": True, "decode_gdn": "fused"},
            # the engine's own defaults in bfloat16: the packaged table's gemms, dependent launches where the GPU can
            "graphs-bf16-default": {"decode_kernels": "triton", "cuda_graphs": True, "dtype": "bfloat16"},
            # the same with a split gemm's parts added by its own second launch, not by the norm that reads them
            "graphs-bf16-gemm-sums": {"decode_kernels": "triton", "cuda_graphs": True, "dtype": "bfloat16",
                                      "decode_split_sums": "gemm"},
            # ... with the MLP's activation in a launch of its own, not in the gate | up gemm's
            "graphs-bf16-swiglu-rows": {"decode_kernels": "triton", "cuda_graphs": True, "dtype": "bfloat16",
                                        "decode_swiglu": "rows"},
            # ... with each GDN layer's output norm in its replay's launch
            "graphs-bf16-gdn2": {"decode_kernels": "triton", "cuda_graphs": True, "dtype": "bfloat16",
                                 "decode_gdn": "two"},
            "triton": {**_PLAIN, "cuda_graphs": False},
            "reference": {"decode_kernels": "reference"}}
# the defaults with ``--gemm-table``'s decode gemm table in the package's place (``EngineConfig.decode_gemm_table``)
TABLE_VARIANT = "graphs-bf16-table"


# each GPU model's device copy bandwidth as measured (torch ``copy_`` of 1 GiB; RESULTS.md), bytes/s: the roofline's
COPY_BANDWIDTH = {"NVIDIA H200": 4.17e12, "NVIDIA H100 80GB HBM3": 3.02e12}


def copy_bandwidth(given: float | None) -> float:
    """``--bandwidth`` if given, else this GPU model's measured copy bandwidth; a GPU not in ``COPY_BANDWIDTH`` needs
    the option (its roofline would otherwise be another card's)."""
    if given is not None:
        return given
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device: its model names the copy bandwidth the roofline reads")
    name = torch.cuda.get_device_name()
    if name not in COPY_BANDWIDTH:
        raise SystemExit(f"--bandwidth: no copy bandwidth is recorded for {name!r} (known: {sorted(COPY_BANDWIDTH)}); "
                         "measure one (torch copy_ of 1 GiB) and pass it in bytes/s")
    return COPY_BANDWIDTH[name]


def weight_bytes(model, dtype: torch.dtype | None = None) -> int:
    """Bytes of every weight, the projections counted in ``dtype`` (default: as they are)."""
    projections = {id(m.weight) for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    return sum(p.numel() * (torch.empty(0, dtype=dtype).element_size() if dtype and id(p) in projections
                            else p.element_size()) for p in model.parameters())


def engine_decode(model: HybridModel, batch: int, prompt: int, new: int, variant: str = "graphs") -> dict:
    """One engine run; the decode rate is timed inside it, from the step where every sequence has streamed
    ``WARM_TOKENS`` tokens (prefill done, the batch's CUDA graph captured) to the end: decode steps alone."""
    pages = batch * (-(-(prompt + new) // 16)) + 64
    config = EngineConfig(device="cuda", overlap=True, max_running=batch, num_slots=3 * batch + 8, num_pages=pages,
                          max_context=prompt + new + 64, threads=None, **VARIANTS[variant])
    constructing = time.perf_counter()
    engine = Engine(config, model=model)  # (``decode_gemm="auto"`` times its candidates here, once a process)
    start_seconds = time.perf_counter() - constructing
    ids = [engine.submit(p, SamplingParams(max_tokens=new)) for p in prompts(batch, prompt)]
    while min(engine.poll(r)[0] for r in ids) < WARM_TOKENS:
        engine.step()
    torch.cuda.synchronize()
    started, streamed, steps = time.perf_counter(), sum(engine.poll(r)[0] for r in ids), engine.steps
    engine.run()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    assert all(len(engine.result(r).output_ids) == new for r in ids)
    tokens = batch * new - streamed
    # the run's tokens as a digest: variants that claim the same bits (greedy, the same weights) must agree on it
    outputs = hashlib.sha256(json.dumps([engine.result(r).output_ids for r in ids]).encode()).hexdigest()[:16]
    return {"seconds": elapsed, "tokens": tokens, "steps": engine.steps - steps, "tokens_per_s": tokens / elapsed,
            "steps_per_s": (engine.steps - steps) / elapsed, "start_seconds": start_seconds, "outputs": outputs}


WARM_TOKENS = 4


def engine_rate(model: HybridModel, batch: int, args, variant: str) -> dict:
    """The median of ``--repeats`` timed runs of ``--long`` new tokens, after one warm-up run (whose engine's
    construction is ``start_seconds``: the variant's one-time costs in this process, when it is its first)."""
    warm = engine_decode(model, batch, args.prompt, args.short, variant)
    runs = [engine_decode(model, batch, args.prompt, args.long, variant) for _ in range(args.repeats)]
    rates = sorted(r["tokens_per_s"] for r in runs)
    median = rates[len(rates) // 2]
    return {"batch": batch, "tokens_per_s": median, "steps_per_s": median / batch,
            "spread": rates[-1] / rates[0] - 1, "start_seconds": warm["start_seconds"], "runs": runs}


def hf_seconds(hf, batch: int, prompt: int, new: int) -> float:
    ids = torch.tensor(prompts(batch, prompt), device="cuda")
    torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    torch.cuda.synchronize()
    assert out.shape[1] == prompt + new
    return time.perf_counter() - started


def decode_rate(seconds, batch: int, args) -> dict:
    """Tokens/s and steps/s of decode alone, from a short and a long run (after one warm-up): for
    ``transformers.generate``, which cannot be stepped."""
    seconds(batch, args.prompt, args.short)
    short, long = seconds(batch, args.prompt, args.short), seconds(batch, args.prompt, args.long)
    steps = (args.long - args.short) / (long - short)
    return {"batch": batch, "short_s": short, "long_s": long, "steps_per_s": steps, "tokens_per_s": steps * batch}


def profile(model: HybridModel, args) -> None:
    """torch.profiler tables (by CPU and by CUDA time) of one engine run per decode path at the largest batch."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with open(args.profile, "w") as f:
        for variant in args.variants:
            batch = args.profile_batch or max(args.batches)
            engine_decode(model, batch, args.prompt, args.short, variant)  # warm
            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                seconds = engine_decode(model, batch, args.prompt, args.long, variant)["seconds"]
            if args.trace:  # the run's timeline (Chrome trace format): each kernel's start and end, the gaps between
                prof.export_chrome_trace(f"{args.profile}.{variant}.trace.json")
            averages = prof.key_averages()
            f.write(f"== {variant}, batch {batch}, prompt {args.prompt}, {args.long} new tokens: {seconds:.3f} s "
                    f"(under the profiler)\n")
            f.write(averages.table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
            f.write(averages.table(sort_by="self_cuda_time_total", row_limit=30) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--long", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="timed engine runs per row (median, spread)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--hf-dtype", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--trace", action="store_true", help="with --profile, also write each profiled run's "
                                                             "timeline to PROFILE.VARIANT.trace.json")
    parser.add_argument("--profile", default=None,
                        help="write torch.profiler tables of a run at the largest batch here")
    parser.add_argument("--profile-batch", type=int, default=None, help="the batch profiled (default: the largest)")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help=f"device copy bandwidth, bytes/s (default: this GPU model's as measured: "
                             f"{COPY_BANDWIDTH})")
    parser.add_argument("--vocab", type=int, default=None,
                        help=f"vocabulary size (default: the byte tokenizer's 260; {QWEN35_VOCAB}: Qwen3.5's)")
    parser.add_argument("--gemm-table", default=None, metavar="FILE",
                        help="also run the defaults with this decode gemm table in the package's place "
                             "(scripts/tune_decode_gemms.py --out FILE; variant graphs-bf16-table), after --variants")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.bandwidth = copy_bandwidth(args.bandwidth)
    if args.gemm_table is not None:
        if not os.path.isfile(args.gemm_table):
            parser.error(f"--gemm-table: no such file {args.gemm_table!r}")
        VARIANTS[TABLE_VARIANT] = {**VARIANTS["graphs-bf16-default"], "decode_gemm_table": args.gemm_table}
        args.variants = [*args.variants, TABLE_VARIANT]
    import transformers
    from transformers import Qwen3_5ForCausalLM

    transformers.logging.set_verbosity_error()

    config = shape_08b(args.vocab)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(init_weights(HybridModel(config)), folder)
        ours = load_pretrained(folder).cuda()
        cast = {}  # one copy per dtype, made once: an engine uses a model already in its dtype as it is
        rows = []
        for variant in args.variants:
            dtype = VARIANTS[variant].get("dtype", "float32")
            model = cast.setdefault(dtype, ours if dtype == "float32" else
                                    copy.deepcopy(ours).cast_projections(getattr(torch, dtype)))
            for batch in args.batches:
                rows.append({"engine": f"mini-engine ({dtype}, {variant})", "weight_bytes": weight_bytes(model),
                             **engine_rate(model, batch, args, variant)})
        del cast, model
        if args.profile:
            profile(ours, args)
        del ours
        for dtype in args.hf_dtype:
            hf = Qwen3_5ForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).cuda().eval()
            for batch in args.batches:
                rows.append({"engine": f"transformers.generate ({dtype})", "weight_bytes": weight_bytes(hf),
                             **decode_rate(lambda b, p, n, model=hf: hf_seconds(model, b, p, n), batch, args)})
            del hf
            torch.cuda.empty_cache()
    for r in rows:  # steps/s if every step read every weight once at the copy bandwidth
        r["roofline_steps_per_s"] = args.bandwidth / r["weight_bytes"]
    device = torch.cuda.get_device_name()
    print(f"{device}; {config.name}, vocabulary {config.vocab_size}; prompt {args.prompt}, decode {args.short}->"
          f"{args.long} tokens; roofline: the "
          f"weights' bytes at {args.bandwidth / 1e12:.2f} TB/s")
    print(f"{'engine':<38}{'batch':>6}{'tok/s':>10}{'steps/s':>9}{'weights GB':>11}{'of roofline':>12}{'spread':>8}"
          f"{'start s':>9}  tokens (digest)")
    for r in rows:
        spread = f"{r['spread']:.1%}" if "spread" in r else "-"
        digests = " ".join(sorted({run["outputs"] for run in r.get("runs", [])})) or "-"
        print(f"{r['engine']:<38}{r['batch']:>6}{r['tokens_per_s']:>10.1f}{r['steps_per_s']:>9.1f}"
              f"{r['weight_bytes'] / 1e9:>11.2f}{r['steps_per_s'] / r['roofline_steps_per_s']:>12.1%}{spread:>8}"
              f"{r['start_seconds'] if 'start_seconds' in r else float('nan'):>9.2f}  {digests}")
    for ours in (r for r in rows if r["engine"].startswith("mini")):
        for theirs in (r for r in rows if r["batch"] == ours["batch"] and r["engine"].startswith("transformers")):
            print(f"batch {ours['batch']}: {ours['engine']} / {theirs['engine']} = "
                  f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device, "model": config.name, "vocab": config.vocab_size, "bandwidth": args.bandwidth,
                       "prompt": args.prompt, "short": args.short, "long": args.long,
                       "gemm_table": args.gemm_table, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
