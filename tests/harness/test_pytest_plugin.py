"""The ``hammer`` pytest plugin: the probe suite as parametrized tests, embedded and over HTTP, under xdist.

Each case runs pytest in a subprocess (the plugin is an installed entry point, as a user would get it).
"""

import os
import subprocess
import sys

from mini_engine.engine import Engine, EngineConfig
from tests.server.conftest import live_server


def pytest_run(tmp_path, *args):
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "hammer.suite",
               "--hammer-out", str(tmp_path / "runs"), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def test_the_probe_suite_passes_on_the_clean_engine_in_parallel(tmp_path):
    """Two families x 2 probes on two xdist workers: 4 tests, all pass, each leaving its run directory; the engine
    runs the model --hammer-model names."""
    done = pytest_run(tmp_path, "--hammer-target", "embedded", "--hammer-families", "arithmetic,needle",
                      "--hammer-count", "2", "-n", "2", "-q", "--hammer-model", "tiny-random")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "4 passed" in done.stdout
    metas = list((tmp_path / "runs").glob("*/last/meta.json"))
    assert len(metas) == 4 and all('"model": "tiny-random"' in m.read_text() for m in metas)


def test_a_fault_fails_the_probes_with_the_verdict_and_the_reproduction(tmp_path):
    """media_key=off: the media probes fail, naming the oracle, the attribution and the commands to reproduce."""
    done = pytest_run(tmp_path, "--hammer-target", "embedded", "--hammer-families", "media", "--hammer-count", "1",
                      "--hammer-fault", "media_key=off")
    assert done.returncode == 1, done.stdout[-3000:]
    out = done.stdout
    assert "1 failed" in out and "echo: mismatch" in out and "attribution key-or-payload" in out
    assert "against its cold control: " in out and "positions both runs wrote" in out
    assert "reproduce the family's suite: hammer probe media --count 2 --seed 0 --target embedded --fault " \
           "media_key=off" in out
    assert "replay this probe exactly: hammer replay " in out


def test_the_suite_runs_against_a_real_server(tmp_path, tiny_model):
    """--hammer-target URL: the same probes over HTTP against mini-engine's server (cache on) pass."""
    with live_server(Engine(EngineConfig(overlap=True), model=tiny_model)) as hot, \
            live_server(Engine(EngineConfig(enable_cache=False), model=tiny_model)) as cold:
        done = pytest_run(tmp_path, "--hammer-target", hot.url, "--hammer-control-url", cold.url,
                          "--hammer-families", "arithmetic,recall", "--hammer-count", "1", "-q")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout


def test_bad_plugin_options_are_usage_errors(tmp_path):
    """No target, an unknown family, or a fault for an HTTP target: pytest stops with a message naming the option."""
    cases = [((), "needs --hammer-target"),
             (("--hammer-target", "embedded", "--hammer-families", "nope"), "--hammer-families: unknown nope"),
             (("--hammer-target", "http://127.0.0.1:9", "--hammer-fault", "media_key=off"),
              "--hammer-fault applies to --hammer-target embedded only")]
    for args, message in cases:
        done = pytest_run(tmp_path, *args)
        assert done.returncode != 0 and message in done.stdout + done.stderr, (args, done.stdout, done.stderr)
