"""One harness run end to end: the run directory, the target, the soak rounds, the verdicts.

``execute`` is what ``hammer soak`` / ``run`` / ``probe`` do; ``plan_of`` and ``target_of`` rebuild
a stored run's plan and target from its meta.json (what ``--resume`` and ``hammer replay`` need).
The target is one option -- ``embedded`` or an ``http(s)://`` URL -- and nothing downstream of it
depends on which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from forensics import RunDir, RunMeta
from hammer.patterns import Op
from hammer.soak import SoakPlan, judge, next_round, run_soak, write_junit
from hammer.targets import Target, make_target

__all__ = ["engine_options", "execute", "plan_of", "target_of"]

EMBEDDED = "embedded"


def engine_options(meta_engine: Mapping[str, Any] | None = None, **given: Any) -> dict[str, Any]:
    """The embedded engine's options: the given ones, the ledger's reference states on unless given."""
    options = {"reference_states": True,  # attribution needs the cold checksum of every donated prefix
               **(meta_engine or {}), **{k: v for k, v in given.items() if v is not None}}
    options["faults"] = tuple(options.get("faults", ()))
    return options


def plan_of(meta: RunMeta) -> SoakPlan:
    extra = meta.extra
    settings = {k: v for p in meta.patterns for k, v in (p.get("settings") or {}).items()}
    return SoakPlan(tuple(p["name"] for p in meta.patterns), int(meta.seeds["pattern"]),
                    round_size=int(extra["round_size"]), requests=extra.get("requests"),
                    duration=extra.get("duration"), settings=tuple(sorted(settings.items())),
                    concurrency=extra.get("concurrency"),
                    schedule=tuple(Op.from_invoke(op) for op in extra.get("schedule") or ()))


def target_of(meta: RunMeta, *, http: Mapping[str, Any] | None = None) -> Target:
    """The target a stored run used (HTTP secrets are never stored: pass ``http`` options again)."""
    if meta.target.get("kind") == EMBEDDED:
        return make_target(EMBEDDED, engine=engine_options(meta.engine))
    stored = {"model": meta.target.get("model"), "control_url": meta.target.get("control_url"),
              "request_ids": meta.target.get("request_ids"), "request_id_field": meta.target.get("request_id_field")}
    return make_target(meta.target["url"], http={**stored, **(http or {})})


def _meta(target: Target, plan: SoakPlan, command: tuple[str, ...]) -> RunMeta:
    engine = target.engine()
    seeds = {"pattern": plan.seed, **({"device": int(engine["device_seed"])} if "device_seed" in engine else {})}
    settings = dict(plan.settings)
    return RunMeta(target=target.describe(), patterns=tuple({"name": p, "settings": settings} for p in plan.patterns),
                   seeds=seeds, engine=engine, faults=target.faults, command=command,
                   extra={"round_size": plan.round_size, "requests": plan.requests, "duration": plan.duration,
                          "concurrency": plan.concurrency, "controls": target.controls,
                          **({"schedule": [op.as_record() for op in plan.schedule]} if plan.schedule else {})})


def execute(*, target: str, plan: SoakPlan | None, out: Path, engine: Mapping[str, Any] | None = None,
            http: Mapping[str, Any] | None = None, resume: Path | None = None, max_rate: float = 0.0,
            junit: Path | None = None, command: tuple[str, ...] = (), echo: Callable[[str], None] = print,
            progress: Any = None) -> tuple[Path, int, dict[str, Any]]:
    """Run (or resume) a soak; returns (run directory, exit code, summary).

    Raises TargetUnavailable when the target cannot be reached, ValueError for a bad plan or option.
    """
    if resume is not None:
        run = RunDir.open(resume)
        plan, first, runner = plan_of(run.meta), next_round(run), target_of(run.meta, http=http)
    else:
        runner = make_target(target, engine=engine_options(engine) if target == EMBEDDED else None, http=http)
        runner.check()  # an unreachable target fails before a run directory exists; meta names the server
        run, first = RunDir.create(out, _meta(runner, plan, command)), 0
    runner.attach(run.path)
    described = runner.describe()
    sent = f" (X-Request-Id {described['request_ids']}-<request>)" if described.get("request_ids") else ""
    echo(f"hammer: seed {plan.seed}, patterns {', '.join(plan.patterns)}, target {described.get('url', EMBEDDED)}"
         f"{sent}, faults {', '.join(runner.faults) or 'none'} -> {run.path}")
    try:
        run_soak(runner, run, plan, first_round=first, progress=progress)
    finally:
        runner.close()
        run.finish()
    analysis, summary, code = judge(run.path, max_rate=max_rate)
    if junit is not None:
        write_junit(analysis, junit)
    return run.path, code, summary
