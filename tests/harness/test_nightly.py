"""scripts/nightly.sh at toy size: both parts run, their artefacts land in OUT_DIR, and the exit code is theirs."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def nightly(out, **env):
    """The script with this interpreter's ``hammer`` first on PATH (the tests' install, activated or not)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(["bash", str(ROOT / "scripts" / "nightly.sh"), str(out)], capture_output=True, text=True,
                          env={**os.environ, "PATH": path, "SEED": "3", **env}, cwd=ROOT, timeout=600, check=False)


def test_a_toy_nightly_writes_the_soak_and_the_matrix_with_junit(tmp_path):
    """A 4-request soak and a one-cell quick matrix: exit 0, JUnit for both, reports for both."""
    done = nightly(tmp_path, SOAK_REQUESTS="4", MATRIX_ARGS="--quick --faults media_key=off")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "soak-junit.xml").exists() and (tmp_path / "matrix" / "junit.xml").exists()
    assert (tmp_path / "soak" / "last" / "report" / "report.html").exists()
    assert (tmp_path / "matrix" / "matrix.md").exists() and (tmp_path / "matrix" / "report" / "report.md").exists()
    assert "nightly: soak exit 0, matrix exit 0" in done.stdout


def test_a_failing_part_fails_the_nightly_but_the_other_part_still_runs(tmp_path):
    """A matrix that cannot run (an unknown cell) fails the nightly with its exit code; the soak still ran."""
    done = nightly(tmp_path, SOAK_REQUESTS="4", MATRIX_ARGS="--quick --faults nope")
    assert done.returncode != 0
    assert (tmp_path / "soak-junit.xml").exists() and "matrix exit 2" in done.stdout
