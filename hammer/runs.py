"""One harness run end to end: the run directory, the target, the soak rounds, the verdicts.

``execute`` is what ``hammer soak`` / ``hammer run`` do; ``plan_of`` rebuilds a stored run's plan
from its meta.json (what ``--resume`` and ``hammer replay`` need).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from forensics import RunDir, RunMeta, resolve_run
from hammer.soak import SoakPlan, judge, next_round, run_soak, write_junit
from hammer.targets import make_target

__all__ = ["engine_options", "execute", "plan_of"]


def engine_options(meta_engine: dict[str, Any] | None = None, **given: Any) -> dict[str, Any]:
    """The embedded engine's options: the given ones, the ledger's reference states always on."""
    options = {**(meta_engine or {}), **{k: v for k, v in given.items() if v is not None}}
    options["faults"] = tuple(options.get("faults", ()))
    options["reference_states"] = True  # attribution needs the cold checksum of every donated prefix
    return options


def plan_of(meta: RunMeta) -> SoakPlan:
    extra = meta.extra
    return SoakPlan(tuple(p["name"] for p in meta.patterns), int(meta.seeds["pattern"]),
                    round_size=int(extra["round_size"]), requests=extra.get("requests"),
                    duration=extra.get("duration"))


def execute(*, seed: int | str, out: Path, faults, overlap: bool, device_seed: int, max_rate: float,
            junit: Path | None, patterns, requests: int | None, duration: float | None, round_size: int,
            resume: Path | None, command: tuple[str, ...], echo: Callable[[str], None] = print):
    """Run (or resume) a soak on the embedded engine; returns (run directory, exit code, summary)."""
    if resume is not None:
        run = RunDir.open(resume)
        plan, options, first = plan_of(run.meta), engine_options(run.meta.engine), next_round(run)
    else:
        if seed == "last":
            seed = int(RunDir.open(resolve_run(out, "last")).meta.seeds["pattern"])
        plan = SoakPlan(tuple(patterns), int(seed), round_size=round_size, requests=requests, duration=duration)
        options = engine_options(faults=tuple(faults), overlap=overlap, device_seed=device_seed)
        first, run = 0, None
    if run is None:
        engine = {**options, "faults": sorted(options["faults"])}
        meta = RunMeta(target={"kind": "embedded", "device": "sim", "model": options.get("model") or "tiny-random"},
                       patterns=tuple({"name": p, "settings": {}} for p in plan.patterns),
                       seeds={"pattern": plan.seed, "device": int(options.get("device_seed", 0))},
                       engine=engine, faults=tuple(engine["faults"]), command=command,
                       extra={"round_size": plan.round_size, "requests": plan.requests, "duration": plan.duration})
        run = RunDir.create(out, meta)
    target = make_target("embedded", engine=options, ledger=run.ledger_path)
    echo(f"hammer: seed {plan.seed}, patterns {', '.join(plan.patterns)}, faults {', '.join(target.faults) or 'none'}"
         f" -> {run.path}")
    try:
        run_soak(target, run, plan, first_round=first)
    finally:
        target.close()
        run.finish()
    analysis, summary, code = judge(run.path, max_rate=max_rate)
    if junit is not None:
        write_junit(analysis, junit)
    return run.path, code, summary
