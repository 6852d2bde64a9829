"""Embedded engine throughput on CPU: the same hit-heavy workload under several engine modes, one process.

Modes: donation copy vs transfer, overlap, the cache off, and the slot ledger on (an instrumentation
sink: every slot event with the checksum of the bytes it wrote or read; "+ refs" adds the cold
reference state of every donated prefix, which attribution uses). Workload: 48 requests over 6 shared 130-token prefixes plus 1-40 private tokens, 8 generated tokens
each, arriving 2 per step. Prints a table (requests/s, generated tokens/s, hit rate) and writes JSON.
Each mode runs ``--repeats`` times after one discarded warm-up run; the median is reported with the
spread (max/min - 1). ``--device cuda`` runs every mode on the GPU (real streams).
Usage: ``python benchmarks/engine_throughput.py [--repeats N] [--device sim|cuda] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.model import build_builtin

LEDGER = "ledger"  # not an engine option: run with an instrumentation sink (every slot event + its checksum)
MODES = {
    "copy, no overlap": dict(),
    "copy, overlap": dict(overlap=True),
    # the seeds' "before": zero-copy donation, no admission barriers, no readback fence
    "safeguards off, overlap": dict(overlap=True, faults=("donate=transfer", "admission_barrier=off",
                                                          "metadata_fence=off")),
    "transfer, no overlap": dict(donate_policy="transfer"),
    "cache off": dict(enable_cache=False),
    "copy, ledger": {LEDGER: True},
    "copy, ledger + refs": {LEDGER: True, "reference_states": True},
}


def workload(seed: int = 0):
    rnd = random.Random(seed)
    prefixes = [[rnd.randrange(256) for _ in range(130)] for _ in range(6)]
    return [(rnd.choice(prefixes) + [rnd.randrange(256) for _ in range(rnd.randrange(1, 40))], i // 2)
            for i in range(48)]


def run(model, options: dict, device: str = "sim") -> dict:
    options = dict(options)
    rows = [] if options.pop(LEDGER, False) else None
    engine = Engine(EngineConfig(**options, device=device), model=model, sink=None if rows is None else rows.append)
    requests = workload()
    started = time.perf_counter()
    ids = [engine.submit(p, SamplingParams(max_tokens=8), at_step=step) for p, step in requests]
    engine.run()
    elapsed = time.perf_counter() - started
    results = [engine.result(r) for r in ids]
    generated = sum(len(r.output_ids) for r in results)
    return {"seconds": elapsed, "requests": len(ids), "generated": generated,
            "hit_rate": sum(r.cached_tokens > 0 for r in results) / len(ids), "steps": engine.steps,
            "ledger_rows": None if rows is None else len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=("sim", "cuda"), default="sim")
    parser.add_argument("--out", default="benchmarks/engine_throughput.json")
    args = parser.parse_args()
    model = build_builtin()
    run(model, {}, args.device)  # warm-up: the first run pays one-time costs that would bias whichever mode went first
    rows = {}
    for _ in range(args.repeats):  # interleaved, so drift on a noisy machine hits every mode alike
        for name, options in MODES.items():
            rows.setdefault(name, []).append(run(model, options, args.device))
    summary = {name: {**runs[0], "seconds": statistics.median(r["seconds"] for r in runs),
                      "spread": max(r["seconds"] for r in runs) / min(r["seconds"] for r in runs) - 1}
               for name, runs in rows.items()}
    base = summary["copy, no overlap"]["seconds"]
    print(f"{'mode':<24}{'req/s':>8}{'tok/s':>8}{'hits':>7}{'steps':>7}{'time vs copy':>14}{'spread':>8}")
    for name, r in summary.items():
        print(f"{name:<24}{r['requests'] / r['seconds']:>8.1f}{r['generated'] / r['seconds']:>8.1f}"
              f"{r['hit_rate']:>7.0%}{r['steps']:>7}{r['seconds'] / base:>14.2f}{r['spread']:>8.1%}")
    rows = {"runs": rows, "summary": summary}
    with open(args.out, "w") as handle:
        json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
