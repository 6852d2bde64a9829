"""Cold probe accuracy of a model: every family at its default settings, on probe seeds no training used.

Each probe is submitted alone to an engine with its prefix cache off and sampled greedily
(``mini_engine.train.evaluate.ask_engine``): the ground truth a soak's cold controls rely on. Training
draws its probes from ``train/...`` ids and from example seeds below 10^6, and validates on seed
7,000,003; the default seed here (20,261,203) is neither. Prints one row per family (correct / total,
the 95% Wilson interval) and writes JSON with the first misses.

Usage: ``python benchmarks/probe_accuracy.py [--model probe-tiny] [--count 100] [--seed S] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from mini_engine.model import load_model
from mini_engine.train.evaluate import ask_engine, eval_probes, score
from reports.stats import wilson

FAMILIES = ("arithmetic", "needle", "recall", "media")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="probe-tiny")
    parser.add_argument("--count", type=int, default=100, help="probes per family")
    parser.add_argument("--seed", type=int, default=20_261_203)
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.model)
    rows = []
    for family in FAMILIES:
        probes = eval_probes(family, args.seed, args.count)
        started = time.perf_counter()
        result = score(family, probes, ask_engine(model, probes), keep_wrong=10)
        rate = wilson(result.correct, result.total)
        rows.append({**result.as_dict(), "wilson_low": rate.lower, "wilson_high": rate.upper,
                     "seconds": round(time.perf_counter() - started, 1)})
    print(f"model {args.model}, probe seed {args.seed}, cache off, greedy, one request at a time")
    print(f"{'family':<11} {'correct':>9} {'accuracy':>9} {'95% Wilson':>16} {'seconds':>8}")
    for r in rows:
        print(f"{r['family']:<11} {r['correct']:>4}/{r['total']:<4} {r['accuracy']:>9.1%} "
              f"{r['wilson_low']:>7.1%}-{r['wilson_high']:<7.1%} {r['seconds']:>8.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "seed": args.seed, "count": args.count, "families": rows}, f, indent=2)


if __name__ == "__main__":
    main()
