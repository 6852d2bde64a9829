"""The ``hammer`` pytest plugin: the probe suites as parametrized tests, against any target.

Installed with the package (entry point ``pytest11: hammer``) and inert until ``--hammer-target``
is given; the tests themselves live in ``hammer.suite``::

    pytest --hammer-target embedded --pyargs hammer.suite
    pytest --hammer-target http://127.0.0.1:8000 --hammer-model m --pyargs hammer.suite -n auto

One test per probe (``<family>-<index>``): the probe is asked, asked again (on a caching engine the
second ask is a hit), and its cold control runs alone (on the embedded target: a cache-off engine;
over HTTP: ``--hammer-control-url`` or the same server). Every oracle of the harness judges the
answers. A failing test prints each corrupted request's verdict (the oracles that fired, hit or
cold, what came back) and the commands that reproduce it. Each test writes its run directory
under ``--hammer-out`` (default: pytest's temporary directory), so ``hammer postmortem`` and
``hammer report`` read it like any other run. Tests are independent, so ``-n auto`` (pytest-xdist)
spreads them over workers.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from forensics.divergence import Divergence
from hammer.patterns import HAMMER_ARM

DEFAULT_COUNT = 4


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hammer", "probe suites against an inference engine (hammer.suite)")
    group.addoption("--hammer-target", default=None, metavar="URL|embedded",
                    help="Where the probes go: 'embedded' (the in-process mini engine) or an OpenAI-compatible URL.")
    group.addoption("--hammer-families", default=None, metavar="F1,F2",
                    help="Probe families to run (default: all).")
    group.addoption("--hammer-count", type=int, default=DEFAULT_COUNT, metavar="N", help="Probes per family.")
    group.addoption("--hammer-seed", type=int, default=0, metavar="S", help="Probe seed.")
    group.addoption("--hammer-fault", action="append", default=[], metavar="NAME",
                    help="Embedded target: switch a safeguard off (repeatable).")
    group.addoption("--hammer-model", default=None, metavar="NAME|DIR",
                    help="Embedded target: the engine's model (a built-in name or a checkpoint folder); HTTP target: "
                         "the model name to send.")
    group.addoption("--hammer-api-key", default=None, help="HTTP target: bearer token.")
    group.addoption("--hammer-control-url", default=None, help="HTTP target: a cache-off server for the controls.")
    group.addoption("--hammer-out", default=None, metavar="DIR", help="Where each test's run directory goes.")


def _families(config: pytest.Config) -> list[str]:
    from probes import FAMILIES

    chosen = config.getoption("hammer_families")
    names = list(FAMILIES) if not chosen else [f for f in chosen.split(",") if f]
    unknown = [f for f in names if f not in FAMILIES]
    if unknown:
        raise pytest.UsageError(f"--hammer-families: unknown {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "hammer_probe" not in metafunc.fixturenames:
        return
    config = metafunc.config
    if config.getoption("hammer_target") is None:
        raise pytest.UsageError("hammer.suite needs --hammer-target embedded|URL")
    count = config.getoption("hammer_count")
    if count < 1:
        raise pytest.UsageError(f"--hammer-count must be >= 1; got {count}")
    probes = [(family, i) for family in _families(config) for i in range(count)]
    metafunc.parametrize("hammer_probe", probes, ids=[f"{f}-{i}" for f, i in probes])


class ProbeRun:
    """Runs one probe of the suite against the configured target and explains what it found."""

    def __init__(self, config: pytest.Config, out: Path) -> None:
        self.config, self.out = config, out
        self.target = config.getoption("hammer_target")

    def _options(self) -> tuple[dict | None, dict | None]:
        get = self.config.getoption
        if self.target == "embedded":
            model = get("hammer_model")
            return {"faults": tuple(get("hammer_fault")), **({"model": model} if model else {})}, None
        if get("hammer_fault"):
            raise pytest.UsageError("--hammer-fault applies to --hammer-target embedded only")
        http = {"model": get("hammer_model"), "api_key": get("hammer_api_key"),
                "control_url": get("hammer_control_url")}
        return None, {k: v for k, v in http.items() if v is not None}

    def __call__(self, family: str, index: int) -> tuple[list, Path]:
        from hammer.probing import probe_ops
        from hammer.runs import execute
        from hammer.soak import SCHEDULE, SoakPlan, judge

        seed, count = self.config.getoption("hammer_seed"), self.config.getoption("hammer_count")
        ops = [op for op in probe_ops(family, seed, 2 * count) if op.arm == HAMMER_ARM][2 * index:2 * index + 2]
        plan = SoakPlan((SCHEDULE,), seed, round_size=len(ops), requests=len(ops), schedule=tuple(ops))
        engine, http = self._options()
        run_dir, _, _ = execute(target=self.target, plan=plan, out=self.out / f"{family}-{index}", engine=engine,
                                http=http, command=("pytest", "--hammer-target", self.target),
                                echo=lambda _line: None)
        analysis, _, _ = judge(run_dir)
        return list(analysis.corrupted), run_dir

    def explain(self, family: str, index: int, corrupted: list, run_dir: Path) -> str:
        get = self.config.getoption
        stored = json.loads((run_dir / "attribution.json").read_text())
        attribution = {v["request"]: v["verdict"] for v in stored["verdicts"]}
        parted = {p["rid"]: Divergence.from_dict(p).describe() for p in stored.get("parted", ())}
        lines = [f"probe {family}-{index}: {len(corrupted)} corrupted request(s)"]
        for row in corrupted:
            lines.append(f"  {row.request} ({'hit' if row.hit else 'cold'}, cached {row.cached_tokens}): "
                         f"attribution {attribution.get(row.request, '-')}")
            if row.request in parted:
                lines.append(f"    against its cold control: {parted[row.request]}")
            for name in row.fired:
                check = row.checks[name]
                lines.append(f"    {name}: {check.label} {json.dumps(dict(check.details), default=str)[:300]}")
        suite = ["hammer", "probe", family, "--count", str(2 * get("hammer_count")), "--seed", str(get("hammer_seed")),
                 "--target", self.target, *[a for f in get("hammer_fault") for a in ("--fault", f)]]
        lines += [f"run directory: {run_dir}  (hammer postmortem {shlex.quote(str(run_dir))})",
                  f"reproduce the family's suite: {shlex.join(suite)}"]
        if self.target == "embedded":
            lines.append(f"replay this probe exactly: hammer replay {shlex.quote(str(run_dir))}")
        return "\n".join(lines)


@pytest.fixture
def hammer_run(request: pytest.FixtureRequest, tmp_path: Path) -> ProbeRun:
    """Runs a probe (``hammer_run(family, index)``) against ``--hammer-target``."""
    chosen = request.config.getoption("hammer_out")
    return ProbeRun(request.config, Path(chosen) if chosen else tmp_path)
