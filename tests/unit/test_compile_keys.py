"""What a Triton kernel is compiled for must not change with the batch: a new compile costs seconds mid-run
(measured on the H200: 3 kernels, 7 s, on a new workload's batch layouts). Two things decide it besides the
constexprs: an int argument's being 1 or a multiple of 16, and a pointer's 16-byte alignment."""

import ast
from pathlib import Path

import pytest
import torch

import mini_engine.ops
from mini_engine.ops.gated_delta_rule.triton import _chunk_tables

OPS = Path(mini_engine.ops.__file__).parent


def _unspecialised() -> list[tuple[str, str, list[str], list[str]]]:
    """(file, kernel, its parameters, the names its ``triton.jit(do_not_specialize=...)`` lists) in the ops."""
    found = []
    for path in sorted(OPS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                for kw in getattr(deco, "keywords", ()):
                    if kw.arg in ("do_not_specialize", "do_not_specialize_on_alignment"):
                        found.append((path.name, node.name, [a.arg for a in node.args.args],
                                      [e.value for e in kw.value.elts]))
    return found


def test_unspecialised_arguments_name_real_parameters():
    """Triton ignores a name that is not a parameter: a typo would silently bring the recompiles back."""
    found = _unspecialised()
    assert {kernel for _, kernel, _, _ in found} >= {"_prefill_kernel", "_gated_rms_norm_kernel",
                                                     "_sigmoid_mul_kernel", "_linear_kernel"}
    for path, kernel, params, names in found:
        assert names and set(names) <= set(params), f"{path}:{kernel} lists {names}; parameters {params}"


@pytest.mark.parametrize("cu_seqlens", [(0, 1), (0, 70, 75, 200), (0, 3, 5, 6, 7, 8), tuple(range(0, 700, 7))])
def test_chunk_tables_start_on_16_byte_boundaries(cu_seqlens):
    plan, tables = _chunk_tables(cu_seqlens, torch.device("cpu"))
    assert all(t.data_ptr() % 16 == 0 for t in tables)
    starts = list(cu_seqlens[:-1])
    lengths = [b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])]
    assert [t.tolist() for t in tables] == [plan.chunk_row0, plan.chunk_rows, starts, lengths,
                                            plan.seq_first_boundary]
