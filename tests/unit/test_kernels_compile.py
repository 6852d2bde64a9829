"""Every Triton kernel compiles for the H200 (sm_90) and fits its shared memory, checked on a machine without a GPU.

The interpreter that runs the kernels everywhere else in this suite executes them as Python: a construct
the compiler rejects, or pipeline stages that ask more shared memory than a block may have (a GPU run
once found the GDN walk asking 262,664 bytes in float32), shows only on a GPU. ``kernel_launches``
records the launches of the engine's paths on the 0.8B shape's head sizes, float32 and bfloat16, and
compiles each distinct signature to a cubin with this machine's triton."""

import ast
import json
from pathlib import Path

import mini_engine.ops
from tests.unit.kernel_launches import SHARED_LIMIT, run_step


def _kernels_defined(*, with_parameter: str | None = None) -> set[tuple[str, str]]:
    """(module, name) of every ``@triton.jit`` function named ``_*_kernel`` in the ops: the launchable ones; with
    ``with_parameter``, those that take it."""
    found = set()
    ops = Path(mini_engine.ops.__file__).parent
    for path in ops.rglob("*.py"):
        module = "mini_engine." + ".".join(path.relative_to(ops.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                    "jit" in ast.unparse(deco) for deco in node.decorator_list) and (
                    with_parameter is None or with_parameter in {a.arg for a in node.args.args}):
                found.add((module, node.name))
    return found


def test_every_kernel_compiles_for_the_h200(tmp_path):
    launches = tmp_path / "launches.json"
    run_step("record", launches, interpret=True)
    recorded = json.loads(launches.read_text())
    missing = _kernels_defined() - {(e["module"], e["kernel"]) for e in recorded}
    assert not missing, f"kernels the recorder never launched (exercise them in kernel_launches): {sorted(missing)}"
    results = json.loads(run_step("compile", launches, interpret=False))
    assert len(results) == len(recorded)
    failed = [f"{r['module']}.{r['kernel']} {r['constexprs']}: {r['error']}" for r in results if "error" in r]
    assert not failed, "\n".join(failed)
    over = [(r["kernel"], r["constexprs"], r["shared"]) for r in results if r["shared"] > SHARED_LIMIT]
    assert not over, f"asks more than the H200's {SHARED_LIMIT} bytes of shared memory per block: {over}"
    # programmatic dependent launches (ops.pdl): a kernel launched so may start before the one before it ends, so it
    # must wait for it first; every kernel that can be launched so was, and waits
    dependent = [r for r in results if r["options"].get("launch_pdl")]
    assert all(r["constexprs"].get("PDL") for r in dependent), "a dependent launch of a kernel told not to wait"
    assert all(r["waits"] == bool(r["constexprs"].get("PDL")) for r in results), \
        [(r["kernel"], r["constexprs"].get("PDL")) for r in results if r["waits"] != bool(r["constexprs"].get("PDL"))]
    assert {(r["module"], r["kernel"]) for r in dependent} == _kernels_defined(with_parameter="PDL")
    # a dependent gemm that asks the L2 for its weight rows (GemmConfig.prefetch) does so before its wait, and only it
    early = [r for r in results if r["constexprs"].get("PREFETCH") and r["constexprs"].get("PDL")]
    assert early and all(r["prefetches"] == 1 for r in early), [(r["constexprs"], r["prefetches"]) for r in early]
    assert all(r["prefetches"] == -1 for r in results if r not in early)
