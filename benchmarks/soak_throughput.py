"""Clean embedded soak throughput, then the replay of the same run directory (both timed).

    python benchmarks/soak_throughput.py --requests 2000 [--reference-states] [--out runs-bench]

One process: the soak (default patterns round robin, every safeguard on, sim device, 1 thread),
its verdicts, then ``hammer replay`` of the run directory. Prints a table and writes
``soak_throughput.json`` beside the run. Reference states (the cold checksum of every donated
prefix, which attribution uses) are off by default: they are evidence for corrupted runs and
cost a cold prefill per donation; ``--reference-states`` measures with them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hammer.cli import DEFAULT_PATTERNS
from hammer.replay import replay_run
from hammer.runs import execute
from hammer.soak import SoakPlan
from reports.stats import wilson


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--round-size", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs-bench"))
    parser.add_argument("--reference-states", action="store_true")
    parser.add_argument("--no-replay", action="store_true")
    args = parser.parse_args()
    plan = SoakPlan(DEFAULT_PATTERNS, args.seed, round_size=args.round_size, requests=args.requests)
    started = time.perf_counter()
    run_dir, code, summary = execute(target="embedded", plan=plan, out=args.out,
                                     engine={"reference_states": args.reference_states})
    soak_s = time.perf_counter() - started
    figures = _figures(summary, soak_s, code)
    if not args.no_replay:
        started = time.perf_counter()
        difference = replay_run(run_dir)
        figures.update(replay_s=round(time.perf_counter() - started, 1), replay_identical=difference is None,
                       replay_difference=difference)
    (Path(run_dir) / "soak_throughput.json").write_text(json.dumps(figures, indent=2) + "\n")
    width = max(map(len, figures))
    print("\n".join(f"{k:<{width}}  {v}" for k, v in figures.items()))


def _figures(summary: dict, soak_s: float, code: int) -> dict:
    c = summary["counts"]
    bound = wilson(c["corrupted_hits"], c["hits"], sided="upper")
    return {"run": summary["run"], "exit_code": code, "requests": c["requests"], "hammer": c["hammer"],
            "controls": c["controls"], "completed": c["completed"], "hits": c["hits"],
            "hit_rate": round(c["hits"] / max(1, c["completed"]), 3), "hit_share_of_hammer": round(
                c["hits"] / max(1, c["hammer"]), 3), "abandoned": c["abandoned"], "corrupted": c["corrupted"],
            "corrupted_hits": c["corrupted_hits"], "corrupted_hit_rate_upper_95": round(bound.upper, 5),
            "soak_s": round(soak_s, 1), "hammer_per_s": round(c["hammer"] / soak_s, 2),
            "requests_per_s": round(c["requests"] / soak_s, 2), "valid": summary["valid"]}


if __name__ == "__main__":
    main()
