"""The README's two first commands stay what CI runs: the same install, the test command .ci/run runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_test_command_is_the_one_ci_runs():
    """The README's second command ends with exactly the pytest line of .ci/run, after the same installs."""
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    soak, tests = blocks[0], blocks[1]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert tests.endswith("&& " + ci[-1])
    for install in ("torch==2.13.0", "-e '.[test,cpu]'"):
        assert f"pip install {install}" in tests and f"pip install {install}" in soak
        assert any("pip install" in line and line.endswith(install) for line in ci)
    assert "hammer soak" in soak
    # the system package a test needs (headless chromium), installed by one script both run first
    assert tests.startswith("bash scripts/install_chromium.sh && ")
    assert "bash scripts/install_chromium.sh" in ci
