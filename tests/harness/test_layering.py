"""Layering (DESIGN.md §2): the harness's evidence readers and pure generators never import the engine."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# package folder -> top-level packages it must not import
FORBIDDEN = {
    "forensics": {"mini_engine", "hammer", "probes", "reports"},
    "probes": {"mini_engine", "hammer", "reports"},
    "hammer/patterns": {"mini_engine", "reports"},
}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_package_imports_nothing_above_or_beside_it(folder):
    """No module of the folder imports a package its layer may not depend on."""
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files
    offenders = {str(f.relative_to(ROOT)): sorted(_imported_packages(f) & FORBIDDEN[folder]) for f in files}
    assert {f: bad for f, bad in offenders.items() if bad} == {}


def test_the_engine_reads_no_harness_package_outside_its_trainer():
    """mini_engine serves any client: only mini_engine/train (whose data are the probe families) reads probes."""
    harness = {"hammer", "probes", "forensics", "reports"}
    offenders = {}
    for path in sorted((ROOT / "mini_engine").rglob("*.py")):
        allowed = {"probes"} if path.parent.name == "train" else set()
        bad = sorted(_imported_packages(path) & (harness - allowed))
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


def test_only_the_hammer_cli_imports_reports():
    """hammer below the CLI (targets, interpreter, soak, replay) imports neither reports nor, outside targets, the
    engine. The CLI is cli.py and its options, cli_options.py."""
    hammer = ROOT / "hammer"
    offenders = {}
    for path in sorted(hammer.rglob("*.py")):
        if path.name in ("cli.py", "cli_options.py") and path.parent == hammer:
            continue
        forbidden = {"reports"} | (set() if path.parent.name == "targets" else {"mini_engine"})
        bad = sorted(_imported_packages(path) & forbidden)
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}
