"""Where the slot ledger's host time goes, timed without a profiler's overhead: one run of the ledger mode of
``engine_throughput.py`` with a timer around each of the ledger's functions (inclusive: a function's time includes
the listed ones it calls), next to the run's ``host_seconds`` and wall time and a run of the base mode.

cProfile (``engine_throughput.py --profile``) names the functions but inflates the cost of each Python call about
threefold, which is most of what the ledger is made of; torch.profiler times torch's ops, not the Python around
them. Here each listed function is wrapped in a ``perf_counter`` pair (about 0.2 us a call), so the times are what
the engine pays, give or take that. The timers wrap the run's timed serve alone (not its untimed first serve, whose
calls the table counted twice over until session 19).

The ledger's host time counts a restore's, clone's or decode snapshot's copy whole (on CUDA ``copy_witnessed`` copies
and digests in one launch), though the base makes the same copies its own way (``copy_slot``, ``write_snapshot``). So
the copies are timed in a timed run of the base mode too, and the last line gives what the ledger's copies cost over
the base's and its host time less the base's cost of the copies it stands in for.

Usage: ``python benchmarks/ledger_host_time.py [--device cuda] [--shape 0.8b] [--dtype bfloat16] [--max-tokens 64]
[--repeats N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from engine_throughput import MODES, run  # a sibling script: benchmarks/ is on sys.path when run as a script

from mini_engine.model import build_builtin
from mini_engine.model.builtin import QWEN35_08B

# the ledger's own functions (module, qualified name), in the order the table prints them
TIMED = [
    ("mini_engine.instrument", "Instrumentation.emit"),
    ("mini_engine.instrument", "Instrumentation.emit_rows"),
    ("mini_engine.instrument", "Instrumentation._flush"),
    ("mini_engine.instrument", "Instrumentation._deliver"),
    ("mini_engine.instrument", "_Rows.rows"),
    ("mini_engine.instrument", "Later.resolve_all"),
    ("mini_engine.ops.checksum.deferred", "DeviceDigest.resolve_all"),
    ("mini_engine.ops.checksum.deferred", "on_host"),
    ("mini_engine.ops.checksum.deferred", "DigestRows.take"),
    ("mini_engine.engine.landing", "DigestArena.block"),
    ("mini_engine.engine.runner", "ModelRunner._decode_digests"),
    ("mini_engine.engine.runner", "ModelRunner._report_step"),
    ("mini_engine.engine.runner", "ModelRunner._report_writes"),
    ("mini_engine.engine.runner", "ModelRunner._snapshot_checksums"),
    ("mini_engine.engine.runner", "ModelRunner._staged_digest"),
    ("mini_engine.engine.request", "prefix_digest"),
    ("mini_engine.engine.step_ledger", "logits_checks"),
    ("mini_engine.engine.storage", "StateStorage.step_checksums"),
    ("mini_engine.engine.storage", "StateStorage.checksums"),
    ("mini_engine.engine.storage", "StateStorage.copy_witnessed"),
    ("mini_engine.engine.cache_manager", "CacheManager._copy_reported"),
    ("mini_engine.ops.checksum.state_triton", "StateDigester.__call__"),
    ("mini_engine.ops.checksum.state_triton", "StateCopier.__call__"),
    ("mini_engine.ops.checksum.reference", "checksum_ints"),
    ("mini_engine.ops.checksum.reference", "slot_checksum"),
    ("mini_engine.ops.checksum.reference", "checksum_bytes"),
]
# the copies a run makes with or without the ledger (a restore's, a clone's: ``copy_slot``; a snapshot's:
# ``write_snapshot``), which on CUDA the ledger makes through ``copy_witnessed`` instead (a decode snapshot's too):
# timed in both runs, outermost calls alone in their sum, the ledger's copies cost it what its sum exceeds the base's
COPIES = [
    ("mini_engine.engine.storage", "StateStorage.copy_slot"),
    ("mini_engine.engine.storage", "StateStorage.write_snapshot"),
    ("mini_engine.engine.storage", "StateStorage.copy_witnessed"),
]


class Group:
    """The outermost calls of a set of timed functions, counted once however they nest (``copy_witnessed`` calls
    ``copy_slot`` on the sim): ``calls``, ``seconds``."""

    __slots__ = ("calls", "depth", "names", "seconds")

    def __init__(self, targets: list[tuple[str, str]]) -> None:
        self.names = {qualname for _, qualname in targets}
        self.calls, self.seconds, self.depth = 0, 0.0, 0

    def as_dict(self) -> dict:
        return {"calls": self.calls, "seconds": self.seconds}


@contextmanager
def timed(targets: list[tuple[str, str]], totals: dict[str, list] | None = None, group: Group | None = None
          ) -> Iterator[dict[str, list]]:
    """Wrap each (module, qualified name) in a timer for the block: yields name -> [calls, seconds] (``totals``, when
    given, filled); the functions ``group`` names also add their outermost calls to it. A module-level function is
    replaced wherever a loaded ``mini_engine`` module holds it (its importers' names too)."""
    totals = {} if totals is None else totals
    undo = []
    for module_name, qualname in dict.fromkeys(targets):
        module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
        owner, _, name = qualname.rpartition(".")
        holder = functools.reduce(getattr, owner.split("."), module) if owner else module
        original = holder.__dict__.get(name)
        if original is None:  # renamed or gone: say so rather than time nothing
            raise SystemExit(f"ledger_host_time: {module_name}.{qualname} does not exist")
        totals[qualname] = entry = [0, 0.0]
        wrapper = _timer(original, entry, group if group is not None and qualname in group.names else None)
        places = [holder] if owner else [m for n, m in sys.modules.items()
                                          if n.startswith("mini_engine") and getattr(m, name, None) is original]
        for place in places:
            undo.append((place, name, original))
            setattr(place, name, wrapper)
    try:
        yield totals
    finally:
        for place, name, original in reversed(undo):
            setattr(place, name, original)


def _timer(function, entry: list, group: Group | None = None):
    if isinstance(function, (classmethod, staticmethod)):
        return type(function)(_timer(function.__func__, entry, group))
    clock = time.perf_counter

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started = clock()
        if group is not None:
            group.depth += 1
        try:
            return function(*args, **kwargs)
        finally:
            elapsed = clock() - started
            entry[0] += 1
            entry[1] += elapsed
            if group is not None:
                group.depth -= 1
                if not group.depth:
                    group.calls += 1
                    group.seconds += elapsed

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=("sim", "cuda"), default="sim")
    parser.add_argument("--shape", choices=("tiny", "0.8b"), default="tiny")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each mode (after one untimed)")
    parser.add_argument("--mode", default="copy, overlap, ledger", choices=[m for m in MODES if "ledger" in m])
    parser.add_argument("--base", default="copy, overlap", choices=list(MODES))
    parser.add_argument("--out", default="benchmarks/ledger_host_time.json")
    args = parser.parse_args()
    model = build_builtin() if args.shape == "tiny" else build_builtin(QWEN35_08B)
    if args.device == "cuda":
        model = model.cuda().cast_projections(getattr(torch, args.dtype))
    settings = {"device": args.device, "dtype": args.dtype, "max_tokens": args.max_tokens}
    for name in (args.base, args.mode):  # one-time costs (compiles), untimed
        run(model, MODES[name], **settings)
    base, plain, runs, base_runs = [], [], [], []
    for _ in range(args.repeats):
        base.append(run(model, MODES[args.base], **settings)["seconds"])
        plain.append(run(model, MODES[args.mode], **settings)["seconds"])  # the ledger without timers
        totals, copies = {}, Group(COPIES)
        result = run(model, MODES[args.mode], **settings,  # the timers around the timed serve alone
                     around=lambda totals=totals, copies=copies: timed(TIMED + COPIES, totals, copies))
        runs.append((result, totals, copies))
        totals, copies = {}, Group(COPIES)
        result = run(model, MODES[args.base], **settings,
                     around=lambda totals=totals, copies=copies: timed(COPIES, totals, copies))
        base_runs.append((result, totals, copies))
    result, totals, copies = sorted(runs, key=lambda r: r[0]["seconds"])[len(runs) // 2]
    base_result, base_totals, base_copies = sorted(base_runs, key=lambda r: r[0]["seconds"])[len(base_runs) // 2]
    host = result["safeguard_work"]["ledger_host_seconds"]
    steps = result["steps"]
    print(f"{args.shape} model, {args.dtype}, {args.device}, {args.max_tokens} new tokens a request: {args.base} "
          f"{statistics.median(base):.3f} s, {args.mode} {statistics.median(plain):.3f} s (median of "
          f"{args.repeats}; ratio {statistics.median(p / b for p, b in zip(plain, base)):.3f}); with timers "
          f"{result['seconds']:.3f} s, {result['ledger_rows']} rows, {steps} steps, the ledger's host time "
          f"{host * 1e3:.1f} ms ({result['safeguard_work']['ledger_shadow_seconds'] * 1e3:.1f} of it flushes in the "
          f"device's shadow, {result['safeguard_work']['ledger_overrun_seconds'] * 1e3:.1f} of those outlasted by "
          f"the device)")
    _table(totals, steps)
    print(f"{args.base}, its median timed run ({base_result['seconds']:.3f} s, {base_result['steps']} steps):")
    _table(base_totals, base_result["steps"])
    # the ledger's host time counts copy_witnessed whole; what the base pays for the copies it stands in for is the
    # base's copies less those the ledger's run makes plainly too (a prefill's snapshot)
    witnessed = totals["StateStorage.copy_witnessed"][1]
    replaced = base_copies.seconds - (copies.seconds - witnessed)
    print(f"the copies (the outermost calls of {', '.join(q.rpartition('.')[2] for _, q in COPIES)}): "
          f"{copies.seconds * 1e3:.2f} ms in {copies.calls} calls with the ledger, {base_copies.seconds * 1e3:.2f} ms "
          f"in {base_copies.calls} without: the ledger's copies cost {(copies.seconds - base_copies.seconds) * 1e3:.2f}"
          f" ms more than the base's; its host time counts all of copy_witnessed ({witnessed * 1e3:.2f} ms), of which "
          f"the base pays {replaced * 1e3:.2f} ms for its plain copies: the ledger's host time less those, "
          f"{(host - replaced) * 1e3:.1f} ms")
    with open(args.out, "w") as handle:
        json.dump({"settings": {**settings, "shape": args.shape, "mode": args.mode, "base": args.base},
                   "base_seconds": base, "ledger_seconds": plain, "timed_run": result, "functions": _functions(totals),
                   "base_timed_run": base_result, "base_functions": _functions(base_totals),
                   "copies": {"ledger": copies.as_dict(), "base": base_copies.as_dict(), "witnessed_seconds": witnessed,
                              "replaced_seconds": replaced}}, handle, indent=2)


def _functions(totals: dict[str, list]) -> dict[str, dict]:
    return {k: {"calls": c, "seconds": s} for k, (c, s) in totals.items()}


def _table(totals: dict[str, list], steps: int) -> None:
    print(f"{'function (inclusive)':<44}{'calls':>8}{'ms':>9}{'us/call':>9}{'us/step':>9}")
    for name, (calls, seconds) in totals.items():
        print(f"{name:<44}{calls:>8}{seconds * 1e3:>9.2f}{seconds / max(calls, 1) * 1e6:>9.2f}"
              f"{seconds / steps * 1e6:>9.2f}")


if __name__ == "__main__":
    main()
