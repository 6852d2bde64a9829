"""How often a cache hit differs from its cold run on a clean engine: the reference oracle's false-positive rate.

On the sim in float32 the engine is bit-exact and both rates must be 0. Where exactness is given up
(the GPU; bfloat16 projections) a clean engine's hits can still differ from their cold runs, and the
harness must not call that corruption: this measures by how much. A hit-heavy workload (requests
over a few shared prefixes plus private tails, arriving a few per step, overlap on) runs with the
cache on, then every request again on an engine with the cache off; per engine configuration it
counts the hits whose greedy tokens differ from the cold run's, and those whose logits digest (a
checksum of the exact logits each token was sampled from) differs. For each of those it says where the
hit first parted from its cold run (``forensics.divergence``, from the two ledgers): its live state at
the end of its first forward after the restore, at a later forward, or only the logits of a token with
every state equal. Prints a table (``--explain``: a line per differing hit), writes JSON.

Usage: ``python benchmarks/hit_divergence.py [--device sim|cuda] [--dtypes float32 bfloat16]
[--models tiny-random probe-tiny] [--requests 96] [--max-tokens 16] [--explain] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import random

from forensics.divergence import Divergence, divergences
from mini_engine.engine import Engine, EngineConfig, SamplingParams
from reports.stats import wilson


def workload(requests: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rnd = random.Random(seed)
    prefixes = [[rnd.randrange(256) for _ in range(rnd.randrange(130, 300))] for _ in range(6)]
    return [(rnd.choice(prefixes) + [rnd.randrange(256) for _ in range(rnd.randrange(1, 40))], i // 3)
            for i in range(requests)]


def results(config: EngineConfig, requests, max_tokens: int):
    """(results, ledger rows): with a sink the results carry their logits checks and the rows their slot writes."""
    rows = []
    engine = Engine(config, sink=rows.append)
    ids = [engine.submit(p, SamplingParams(max_tokens=max_tokens), at_step=step) for p, step in requests]
    engine.run()
    return [engine.result(r) for r in ids], rows


def measure(model: str, device: str, dtype: str, requests: int, max_tokens: int) -> dict:
    options = dict(model=model, device=device, dtype=dtype, num_pages=4096, max_running=16, num_slots=64)
    schedule = workload(requests)
    hot, hot_rows = results(EngineConfig(overlap=True, **options), schedule, max_tokens)
    cold, cold_rows = results(EngineConfig(enable_cache=False, **options), schedule, max_tokens)
    hits = [(h, c) for h, c in zip(hot, cold) if h.cached_tokens > 0]
    tokens = sum(h.output_ids != c.output_ids for h, c in hits)
    digests = sum(h.logits_digest != c.logits_digest for h, c in hits)
    parted = [d for d in divergences(hot_rows, cold_rows, logits={h.rid: (h.logit_checks, c.logit_checks)
                                                                  for h, c in hits}) if d.parted]
    config = EngineConfig(**options)
    return {"model": model, "device": device, "dtype": dtype, "bit_exact": config.bit_exact,
            "decode": config.decode_path, "requests": requests, "hits": len(hits), "tokens_differ": tokens,
            "digests_differ": digests, "tokens_differ_ci": _bounds(tokens, len(hits)),
            "digests_differ_ci": _bounds(digests, len(hits)), "parted": _where(parted),
            "divergences": [d.describe() for d in parted]}


def _where(parted: list[Divergence]) -> dict[str, int]:
    """How many differing hits parted first in their first forward's state, a later forward's, or the logits alone."""
    return {"first forward": sum(d.state_at is not None and d.first_forward for d in parted),
            "later forward": sum(d.state_at is not None and not d.first_forward for d in parted),
            "logits only": sum(d.state_at is None for d in parted)}


def _bounds(k: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson interval of k in n."""
    rate = wilson(k, n)
    return rate.lower, rate.upper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("sim", "cuda"), default="sim")
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"), default=["float32", "bfloat16"])
    parser.add_argument("--models", nargs="+", default=["tiny-random", "probe-tiny"])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--explain", action="store_true", help="a line per differing hit: where it parted")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = [measure(model, args.device, dtype, args.requests, args.max_tokens)
            for model in args.models for dtype in args.dtypes]
    print(f"{'model':<13}{'device':>7}{'dtype':>10}{'decode':>11}{'exact':>7}{'hits':>6}"
          f"{'tokens differ':>22}{'digests differ':>22}   parted first in (first forward / later / logits only)")
    for r in rows:
        cells = [f"{r[k]}/{r['hits']} ({r[k + '_ci'][0]:.0%}-{r[k + '_ci'][1]:.0%})"
                 for k in ("tokens_differ", "digests_differ")]
        print(f"{r['model']:<13}{r['device']:>7}{r['dtype']:>10}{r['decode']:>11}{str(r['bit_exact']):>7}"
              f"{r['hits']:>6}{cells[0]:>22}{cells[1]:>22}   {' / '.join(map(str, r['parted'].values()))}")
    for r in rows if args.explain else ():
        print(f"\n{r['model']} {r['dtype']}:", *r["divergences"] or ["no hit parted"], sep="\n  ")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
