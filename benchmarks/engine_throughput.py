"""Embedded engine throughput on CPU: the same hit-heavy workload under several engine modes, one process.

Modes: donation copy vs transfer, overlap, the cache off, the reference prefill (on cuda the engine's
prefills otherwise run the Triton kernels), and the slot ledger on (an instrumentation
sink: every slot event with the checksum of the bytes it wrote or read; "+ refs" adds the cold
reference state of every donated prefix, which attribution uses). Workload: 48 requests over 6 shared
130-token prefixes plus 1-40 private tokens, 8 generated tokens each (``--max-tokens``), arriving 2 per
step. Prints a table (requests/s, generated tokens/s, hit rate) and writes JSON.
Each run is a fresh engine that first serves another workload of the same form, untimed (its
one-time costs: CUDA graph captures), and is timed on the second with the garbage collector off.
Each mode runs ``--repeats`` times after a discarded warm-up run of each, the modes interleaved round by
round; the median time is reported with the spread (max/min - 1), and each mode's time against the
base (the first mode) as the median of the rounds' paired ratios with the lowest and highest: a round's
drift hits both sides of its ratio. ``--device cuda`` runs every mode on the GPU (real streams).
Each run also counts the safeguards' own work (``_safeguard_work``): the clones of copy-on-donate and
their bytes, the barriers' waits, the metadata fence's readbacks and the host time they blocked (an
upper bound of the fence's cost); the base's median run is printed. On cuda the clones' bytes are also
priced at the GPU's copy rate, measured in the same process, and with the readbacks' host time give the
safeguards' own work as a fraction of the run: what a 2 % claim can rest on where the spread of repeated
runs is larger than 2 %.

Next to wall time each run counts the engine thread's CPU time (``time.thread_time``) and its involuntary context
switches (``getrusage``): on a shared host whose other tenants take the CPU from the engine, wall time grows and the
thread's CPU time does not (a host-bound engine's waits on the device spin, so they count as CPU time), so "cpu vs
base", the paired ratio of CPU times, is the ratio with the time the thread was descheduled taken out, and
"preempted" (the median of its runs' switches) says how much there was to take out.

On the GPU the tiny model's steps are host-bound, so a 2 % difference drowns in the host's noise;
``--shape 0.8b --dtype bfloat16 --max-tokens 64`` makes the same workload decode-heavy on the
Qwen3.5-0.8B-shaped model of ``gpu_engine.py`` (CUDA-graphed decode steps), and ``--modes`` picks the
modes to compare (the seeds' claim: the safeguards cost nothing measurable).
Usage: ``python benchmarks/engine_throughput.py [--repeats N] [--device sim|cuda] [--shape tiny|0.8b]
[--dtype float32|bfloat16] [--max-tokens N] [--modes NAME ...] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import resource
import statistics
import time

import torch

from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.model import build_builtin
from mini_engine.model.builtin import QWEN35_08B

LEDGER = "ledger"  # not an engine option: run with an instrumentation sink (every slot event + its checksum)
MODES = {
    "copy, no overlap": dict(),
    "copy, overlap": dict(overlap=True),
    # the seeds' "before": zero-copy donation, no admission barriers, no readback fence
    "safeguards off, overlap": dict(overlap=True, faults=("donate=transfer", "admission_barrier=off",
                                                          "metadata_fence=off")),
    "transfer, no overlap": dict(donate_policy="transfer"),
    "copy, overlap, reference prefill": dict(overlap=True, prefill_kernels="reference"),  # cuda: not the kernels
    "cache off": dict(enable_cache=False),
    "copy, ledger": {LEDGER: True},
    "copy, overlap, ledger": {LEDGER: True, "overlap": True},
    # every step digest reading its slots' whole state back, not through the memo (``ops.checksum.memo``)
    "copy, overlap, ledger read back": {LEDGER: True, "overlap": True, "state_digests": "readback"},
    "copy, ledger + refs": {LEDGER: True, "reference_states": True},
}


def workload(seed: int = 0):
    rnd = random.Random(seed)
    prefixes = [[rnd.randrange(256) for _ in range(130)] for _ in range(6)]
    return [(rnd.choice(prefixes) + [rnd.randrange(256) for _ in range(rnd.randrange(1, 40))], i // 2)
            for i in range(48)]


def run(model, options: dict, device: str = "sim", dtype: str = "float32", max_tokens: int = 8,
        around=contextlib.nullcontext) -> dict:
    """One engine's timed serve of the workload (after an untimed one), ``around()`` entered around the timed part
    alone (``ledger_host_time.py``'s timers)."""
    options = dict(options)
    rows = [] if options.pop(LEDGER, False) else None
    pages = 48 * -(-(170 + max_tokens) // 16) + 64  # every request's pages at once: no eviction, any max_tokens
    engine = Engine(EngineConfig(**options, device=device, dtype=dtype, num_pages=pages, max_running=16, num_slots=64),
                    model=model, sink=None if rows is None else rows.append)
    _serve(engine, workload(seed=1), max_tokens)  # untimed: the engine's one-time costs (CUDA graph captures)
    if rows is not None:
        rows.clear()
    gc.collect()
    gc.disable()  # as timeit does: a collection inside one mode's run is noise, not that mode's cost
    try:
        with around():
            first_step, before, started = engine.steps, _safeguard_work(engine), time.perf_counter()
            cpu_started, switches = time.thread_time(), _preempted()
            ids = _serve(engine, workload(), max_tokens)
            elapsed = time.perf_counter() - started
            cpu, switches = time.thread_time() - cpu_started, _preempted() - switches
    finally:
        gc.enable()
    work = {k: v - before[k] for k, v in _safeguard_work(engine).items()}
    results = [engine.result(r) for r in ids]
    generated = sum(len(r.output_ids) for r in results)
    return {"seconds": elapsed, "cpu_seconds": cpu, "preempted": switches, "requests": len(ids), "generated": generated,
            "hit_rate": sum(r.cached_tokens > 0 for r in results) / len(ids), "steps": engine.steps - first_step,
            "ledger_rows": None if rows is None else len(rows), "safeguard_work": work}


def _host_probe(iterations: int = 100_000, tries: int = 3) -> float:
    """Seconds a fixed pure-Python loop takes now, the fastest of ``tries`` (an interrupt inside one is not the
    host's speed): the host's speed at the time. A host whose clock or neighbours change moves it run to run, and
    the wall-time ratios of host-bound runs move with it."""
    times = []
    for _ in range(tries):
        started, total = time.perf_counter(), 0
        for i in range(iterations):
            total += i
        times.append(time.perf_counter() - started)
    return min(times)


def _preempted() -> int:
    """The calling thread's involuntary context switches so far (the process's where a thread's are not kept)."""
    return resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)).ru_nivcsw


def _safeguard_work(engine: Engine) -> dict:
    """The safeguards' own work so far: copy-on-donate's clones and their bytes, the barriers' waits (slot
    fences: waits queued on events not yet passed), the metadata fence's readbacks and the host time they
    blocked (behind everything the copy stream had queued, clones included)."""
    return {"clones": engine.cache.clones, "clone_bytes": engine.cache.clone_bytes, "waits": engine.fences.waits,
            "readbacks": engine.metadata.readbacks, "readback_seconds": engine.metadata.readback_seconds,
            # the slot ledger's (instrumentation's) own: slot bytes its checksums read, host time it took
            "hashed_bytes": engine.states.hashed_bytes, "ledger_host_seconds": engine.events.host_seconds,
            # of it, the flushes made while the host was about to block on a batch still running (no wall time
            # where the batch was still running when they ended; those it was not, the overruns, up to all theirs)
            "ledger_shadow_seconds": engine.shadow_flush_seconds,
            "ledger_overrun_seconds": engine.shadow_overrun_seconds,
            # the host's time blocked on a batch's results: the device's shadow, where host work costs no wall time
            "host_waited_seconds": engine.runner.waited}


def _on_path(runs: list[dict]) -> dict:
    """Of each run, the share of its time that its ledger's host work can have added to the run's wall time: all of
    it but the flushes in the device's shadow that ended with the batch still running (``_safeguard_work``)."""
    shares = [(w["ledger_host_seconds"] - w["ledger_shadow_seconds"] + w["ledger_overrun_seconds"]) / r["seconds"]
              for r in runs for w in [r["safeguard_work"]]]
    return {"median": statistics.median(shares), "min": min(shares), "max": max(shares), "runs": shares}


def _serve(engine: Engine, requests, max_tokens: int) -> list[str]:
    """Submit ``requests`` at their steps (counted from the engine's current step) and run them to the end."""
    first = engine.steps
    ids = [engine.submit(p, SamplingParams(max_tokens=max_tokens), at_step=first + step) for p, step in requests]
    engine.run()
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=("sim", "cuda"), default="sim")
    parser.add_argument("--shape", choices=("tiny", "0.8b"), default="tiny")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--modes", nargs="+", choices=list(MODES),
                        help="modes to run (the first is the base of 'vs base'); default: all (on the sim, all "
                             "but the reference prefill, which is every mode's prefill there)")
    parser.add_argument("--profile", default=None,
                        help="after the rounds, write here where the host's time goes in a run of the second mode (the "
                             "first without one): torch.profiler's and cProfile's tables, and the functions it spends "
                             "more host time in than the first (the base)")
    parser.add_argument("--out", default="benchmarks/engine_throughput.json")
    args = parser.parse_args()
    args.modes = args.modes or [m for m in MODES if args.device == "cuda" or m != "copy, overlap, reference prefill"]
    model = build_builtin() if args.shape == "tiny" else build_builtin(QWEN35_08B)
    if args.device == "cuda":  # once, not per engine: an engine uses a model already where and as it wants it
        model = model.cuda().cast_projections(getattr(torch, args.dtype))
    settings = dict(device=args.device, dtype=args.dtype, max_tokens=args.max_tokens)
    for name in args.modes:  # warm-up, discarded: first runs pay one-time costs (kernel compiles, the ledger's too)
        run(model, MODES[name], **settings)
    rows = {}
    for _ in range(args.repeats):  # interleaved, so drift on a noisy machine hits every mode alike
        for name in args.modes:
            probe = _host_probe()
            rows.setdefault(name, []).append({**run(model, MODES[name], **settings), "host_probe_seconds": probe})
            print(f"  {name}: {rows[name][-1]['seconds']:.3f} s", flush=True)  # kept if the run is cut short
    base_runs = rows[args.modes[0]]
    summary = {}
    for name, runs in rows.items():
        # paired: round r's time over the base's in the same round (drift between rounds cancels)
        ratios = sorted(r["seconds"] / b["seconds"] for r, b in zip(runs, base_runs))
        cpu_ratios = sorted(r["cpu_seconds"] / b["cpu_seconds"] for r, b in zip(runs, base_runs))
        summary[name] = {**runs[0], "seconds": statistics.median(r["seconds"] for r in runs),
                         "spread": max(r["seconds"] for r in runs) / min(r["seconds"] for r in runs) - 1,
                         "ratio": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1],
                         "best_ratio": min(r["seconds"] for r in runs) / min(b["seconds"] for b in base_runs),
                         "cpu_ratio": statistics.median(cpu_ratios), "cpu_ratio_min": cpu_ratios[0],
                         "cpu_ratio_max": cpu_ratios[-1],
                         "preempted": statistics.median(r["preempted"] for r in runs)}
    print(f"{args.shape} model, {args.dtype}, {args.device}, {args.max_tokens} new tokens per request, "
          f"median of {args.repeats}; base: {args.modes[0]}; vs base: the median of the rounds' paired ratios "
          f"[lowest, highest]; best: the fastest run's time over the base's fastest (a host that only ever adds "
          f"time leaves the fastest runs the least disturbed: read it where the spread is large); cpu vs base: the "
          f"same paired ratio of the engine thread's CPU time (the time it was descheduled taken out), preempted: "
          f"its involuntary context switches, the median of its runs")
    print(f"{'mode':<34}{'req/s':>8}{'tok/s':>8}{'hits':>7}{'steps':>7}{'spread':>8}   vs base{'':>18}best"
          f"   cpu vs base{'':>14}preempted")
    for name, r in summary.items():
        print(f"{name:<34}{r['requests'] / r['seconds']:>8.1f}{r['generated'] / r['seconds']:>8.1f}"
              f"{r['hit_rate']:>7.0%}{r['steps']:>7}{r['spread']:>8.1%}   "
              f"{r['ratio']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]   {r['best_ratio']:.3f}   "
              f"{r['cpu_ratio']:.3f} [{r['cpu_ratio_min']:.3f}, {r['cpu_ratio_max']:.3f}]   {r['preempted']:>9.0f}")
    probes = [r["host_probe_seconds"] for runs in rows.values() for r in runs]
    host_probe = {"min": min(probes), "max": max(probes), "spread": max(probes) / min(probes) - 1}
    print(f"the host's speed: a fixed Python loop before each run took {host_probe['min'] * 1e3:.1f}-"
          f"{host_probe['max'] * 1e3:.1f} ms ({host_probe['spread']:.0%} apart); a host-bound run's wall time moves "
          f"with it, so a ratio finer than that spread is read from the within-run shares below, not from 'vs base'")
    print("the safeguards' own work in the base's median run (a readback's wait includes the copy stream's "
          "queue and, through its predecessor wait, the forward that last read the buffer: an upper bound of "
          "the fence's cost; on the sim, whatever device work the wait makes run)")
    work = _median_run(base_runs)["safeguard_work"]
    seconds = statistics.median(r["seconds"] for r in base_runs)
    print(f"  copy-on-donate: {work['clones']} clones, {work['clone_bytes'] / 1e6:.1f} MB; barriers: "
          f"{work['waits']} waits queued; metadata fence: {work['readbacks']} readbacks blocking the host "
          f"{work['readback_seconds'] * 1e3:.1f} ms ({work['readback_seconds'] / seconds:.2%} of the run)")
    print(f"  the host blocked on the device for {work['host_waited_seconds'] * 1e3:.1f} ms "
          f"({work['host_waited_seconds'] / seconds:.2%} of the run): the rest of the run the device waited for the "
          f"host, and host work there (the ledger's) costs its own time in wall time")
    ledger_mode = next((m for m in args.modes if MODES[m].get(LEDGER)), None)
    ledger = None
    if ledger_mode is not None:
        median = _median_run(rows[ledger_mode])
        ledger = {"mode": ledger_mode, "seconds": median["seconds"], "rows": median["ledger_rows"],
                  "hashed_bytes": median["safeguard_work"]["hashed_bytes"],
                  "host_seconds": median["safeguard_work"]["ledger_host_seconds"],
                  "shadow_seconds": median["safeguard_work"]["ledger_shadow_seconds"],
                  "host_waited_seconds": median["safeguard_work"]["host_waited_seconds"]}
        print(f"  the ledger's own work in its median run ({ledger_mode}): {ledger['rows']} rows; checksums read "
              f"{ledger['hashed_bytes'] / 1e9:.2f} GB of slots; {ledger['host_seconds'] * 1e3:.1f} ms of host time "
              f"({ledger['host_seconds'] / ledger['seconds']:.2%} of the run; on the sim the checksums themselves), "
              f"{ledger['shadow_seconds'] * 1e3:.1f} ms of it flushes in the device's shadow; "
              f"the host blocked on the device {ledger['host_waited_seconds'] * 1e3:.1f} ms")
        ledger["on_path"] = _on_path(rows[ledger_mode])
        print(f"  of each of its runs, the ledger's host time on the step's path at most (its host time less the "
              f"shadow flushes the device outlasted): {ledger['on_path']['median']:.2%} "
              f"[{ledger['on_path']['min']:.2%}, {ledger['on_path']['max']:.2%}] (median [lowest, highest]; a "
              f"within-run share, which a host whose speed drifts scales alike in both terms; in it: the state "
              f"copies the ledger digests as it makes them, whole, which the base makes too: ledger_host_time.py "
              f"prices them; not in it: the ledger's device time and what its work costs the engine's own, caches "
              f"and allocations)")
    bound = None
    if args.device == "cuda":
        bandwidth = copy_bandwidth()
        copies = 2 * work["clone_bytes"] / bandwidth  # each clone byte read once and written once
        bound = {"copy_bandwidth": bandwidth, "clone_copy_seconds": copies,
                 "fraction": (copies + work["readback_seconds"]) / seconds}
        print(f"  the clones as device copies at this GPU's {bandwidth / 1e12:.2f} TB/s: {copies * 1e3:.2f} ms; with "
              f"the readbacks' host time, the safeguards' own work is {bound['fraction']:.2%} of the base's run "
              f"(a bound that the run-to-run spread does not blur; the barriers' waits order work already "
              f"counted)")
        if ledger is not None:
            rate = checksum_rate()
            ledger["checksum_rate"] = rate
            ledger["checksum_seconds"] = ledger["hashed_bytes"] / rate
            ledger["fraction"] = (ledger["checksum_seconds"] + ledger["host_seconds"]) / ledger["seconds"]
            # the floor of the ledger's cost where the run is bound by the device: its bytes hashed, nothing else
            ledger["device_floor"] = ledger["checksum_seconds"] / seconds
            print(f"  the ledger's checksums at this GPU's {rate / 1e12:.2f} TB/s of slot hashed: "
                  f"{ledger['checksum_seconds'] * 1e3:.1f} ms of device time, alone {ledger['device_floor']:.2%} of "
                  f"the base's run; with its host time, {ledger['fraction']:.2%} of its run (a bound: host work that "
                  f"runs while the device is busy costs no wall time; the ratio above is the cost)")
    rows = {"settings": {**settings, "shape": args.shape, "repeats": args.repeats}, "runs": rows, "summary": summary,
            "safeguard_bound": bound, "ledger_work": ledger, "host_probe": host_probe}
    with open(args.out, "w") as handle:
        json.dump(rows, handle, indent=2)
    if args.profile:
        profile(model, args.modes, settings, args.profile)


def profile(model, modes: list[str], settings: dict, path: str) -> None:
    """Where the host's time goes in a run of the examined mode: the second of ``modes`` if given (the first is the
    base, as in the rounds), else the first. torch.profiler's tables (by self CPU and by self device time) of one
    run of it, then cProfile's of another (the Python functions, which torch's op table does not name); with a
    base, cProfile's of a run of the base too and the functions the examined mode spends more host time in (what it
    adds: the ledger's own Python, say, against the same engine without it)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    examined = modes[1] if len(modes) > 1 else modes[0]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if settings["device"] == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        seconds = run(model, MODES[examined], **settings)["seconds"]
    averages = prof.key_averages()
    stats = {}  # mode -> (seconds timed under cProfile, its stats)
    for name in dict.fromkeys([examined, modes[0]]):
        python = cProfile.Profile()
        python.enable()
        timed = run(model, MODES[name], **settings)["seconds"]
        python.disable()
        stats[name] = (timed, pstats.Stats(python))
    with open(path, "w") as f:
        f.write(f"{examined}: {seconds:.3f} s timed under the profiler (its untimed settle pass included below)\n")
        f.write(averages.table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
        if settings["device"] == "cuda":
            f.write(averages.table(sort_by="self_cuda_time_total", row_limit=30) + "\n")
        timed, examined_stats = stats[examined]
        for order in ("tottime", "cumulative"):
            table = io.StringIO()
            examined_stats.stream = table
            examined_stats.sort_stats(order).print_stats(45)
            f.write(f"\ncProfile of another run of {examined} ({timed:.3f} s timed under it), by {order}:\n"
                    + table.getvalue())
        if examined != modes[0]:
            f.write(_profile_difference((examined, *stats[examined]), (modes[0], *stats[modes[0]])))


def _profile_difference(examined: tuple, base: tuple, rows: int = 45) -> str:
    """The functions ``examined``'s run spent more of its own host time in than ``base``'s (cProfile's tottime;
    each a (mode, seconds, pstats.Stats)), largest first, with their call counts in each."""
    (name, seconds, a), (base_name, base_seconds, b) = examined, base
    title = (f"\n{name} ({seconds:.3f} s) against {base_name} ({base_seconds:.3f} s), both under cProfile: the "
             f"functions {name} spends more host time in (tottime, seconds; the positive differences' total last)")
    lines = [title, f"{'extra s':>9} {'calls':>9} {'base calls':>10}  function"]
    extra = []
    for func, (_, calls, tottime, _, _) in a.stats.items():
        _, base_calls, base_tottime, _, _ = b.stats.get(func, (0, 0, 0.0, 0.0, {}))
        extra.append((tottime - base_tottime, calls, base_calls, func))
    extra.sort(key=lambda row: -row[0])
    for more, calls, base_calls, (file, line, function) in extra[:rows]:
        lines.append(f"{more:9.4f} {calls:9d} {base_calls:10d}  {function} ({file}:{line})")
    lines.append(f"{sum(max(row[0], 0.0) for row in extra):9.4f} in all")
    return "\n".join(lines) + "\n"


def _device_seconds(fn) -> float:
    """Median device time of ``fn`` (triton's do_bench, L2 flushed between runs, as the kernel benchmarks time)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=50, return_mode="median") / 1e3


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """This GPU's device-to-device copy rate in bytes/s (read plus written)."""
    source = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    target = torch.empty_like(source)
    return 2 * nbytes / _device_seconds(lambda: target.copy_(source))


def checksum_rate(nbytes: int = 1 << 30) -> float:
    """Bytes/s the slot checksum reads on this GPU: one pass over a pool of 32 slots."""
    from mini_engine.ops.checksum.triton import checksum_lanes

    pool = torch.empty(32, nbytes // 4 // 32, dtype=torch.float32, device="cuda").normal_()
    slots = torch.arange(32, dtype=torch.int32, device="cuda")
    return pool.numel() * 4 / _device_seconds(lambda: checksum_lanes(pool=pool, slots=slots))


def _median_run(runs: list[dict]) -> dict:
    """The run of median time (the upper middle of an even count)."""
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


if __name__ == "__main__":
    main()
