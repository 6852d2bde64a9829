"""``decode_gemm="tuned"``: the decode gemm's choices measured ahead of time per GPU model (``decode_rows.tuned``).

The lookup, the table's format and its refusals are checked here; the packaged table's own choices against
cuBLAS on the GPU they were measured on: ``tests/gpu/test_decode_step_cuda.py``."""

import json

import pytest
import torch

from mini_engine.ops import pdl
from mini_engine.ops.decode_rows import gemm, tuned

H100 = "NVIDIA H100 80GB HBM3"
SWAPPED = gemm.GemmConfig(64, 256, swap=True, tma=True, pdl=True)


def test_a_weight_is_keyed_by_its_dtype_and_shape():
    assert tuned.entry_key(torch.bfloat16, (6144, 1024)) == "bfloat16 6144x1024"
    assert tuned.entry_key(torch.float16, (1024, 3584)) == "float16 1024x3584"


def test_recording_keeps_the_winner_and_its_evidence():
    table = {}
    weight = torch.zeros(4096, 1024, dtype=torch.bfloat16)
    narrow = gemm.GemmConfig(32, 256)
    # (gemm.rank_by_batch's form: each candidate's microseconds at each batch, fastest by their sum first)
    ranking = [(SWAPPED, {1: 8.25, 32: 12.25}), (None, {1: 9.0, 32: 15.25}), (narrow, {1: 7.75, 32: 22.25})]
    entry = tuned.record(table, H100, weight, ranking)
    assert entry["config"] == SWAPPED._asdict() and entry["us"] == 20.5 and entry["cublas_us"] == 24.25
    assert entry["by_batch"] == {
        "1": {"us": 8.25, "cublas_us": 9.0, "fastest": narrow._asdict(), "fastest_us": 7.75},  # the sum's choice
        "32": {"us": 12.25, "cublas_us": 15.25, "fastest": SWAPPED._asdict(), "fastest_us": 12.25}}  # gives up 0.5
    assert entry["triton"] and entry["torch"], "what it was measured with"
    assert table == {H100: {"bfloat16 4096x1024": entry}}
    assert tuned.lookup(table, H100, torch.bfloat16, (4096, 1024)) == (SWAPPED if pdl.available() else None)
    # re-measured: cuBLAS won this time
    tuned.record(table, H100, weight, [(None, {1: 9.0, 32: 10.0}), (SWAPPED, {1: 8.25, 32: 12.25})])
    again = table[H100]["bfloat16 4096x1024"]
    assert again["config"] is None and again["by_batch"]["1"]["fastest"] == SWAPPED._asdict()
    assert again["by_batch"]["32"]["fastest"] is None
    assert tuned.lookup(table, H100, torch.bfloat16, (4096, 1024)) is None, "None: cuBLAS"


def test_what_the_table_does_not_list_goes_to_cublas():
    table = {H100: {"bfloat16 4096x1024": {"config": SWAPPED._asdict()}}}
    assert tuned.lookup(table, "NVIDIA H200", torch.bfloat16, (4096, 1024)) is None, "another GPU"
    assert tuned.lookup(table, H100, torch.float16, (4096, 1024)) is None, "another dtype"
    assert tuned.lookup(table, H100, torch.bfloat16, (1024, 4096)) is None, "another shape"
    assert tuned.tuned(torch.zeros(4096, 1024, dtype=torch.bfloat16)) is None, "a CPU weight"


def test_a_choice_this_triton_cannot_launch_goes_to_cublas(monkeypatch):
    table = {H100: {"bfloat16 4096x1024": {"config": SWAPPED._asdict()}}}
    assert tuned.lookup(table, H100, torch.bfloat16, (4096, 1024)) == SWAPPED
    monkeypatch.setattr(pdl, "available", lambda: False)  # a triton before 3.4: no dependent launches
    assert tuned.lookup(table, H100, torch.bfloat16, (4096, 1024)) is None
    plain = SWAPPED._replace(pdl=False)
    table[H100]["bfloat16 4096x1024"]["config"] = plain._asdict()
    assert tuned.lookup(table, H100, torch.bfloat16, (4096, 1024)) == plain


def test_a_missing_table_is_empty_and_a_malformed_one_is_refused(tmp_path):
    assert tuned.load(tmp_path / "absent.json") == {}
    bad = tmp_path / "table.json"
    for text in ("{not json", json.dumps({H100: {"bfloat16 8x8": {"config": {"block_n": 64, "colour": 1}}}}),
                 json.dumps({H100: {"bfloat16 8x8": {"us": 3.0}}}), json.dumps([1, 2]),
                 json.dumps({H100: {"bfloat16 8x8": {"config": None, "by_batch": {"1": {"fastest": {"colour": 1}}}}}})):
        bad.write_text(text)
        with pytest.raises(ValueError, match=f"{bad}: not a decode gemm table .* scripts/tune_decode_gemms.py"):
            tuned.load(bad)


def test_the_packaged_table_holds_only_todays_candidates():
    """Every choice in the package's table is one ``gemm.configs`` still offers for its shape (a table written for
    an older candidate list would launch a configuration nobody tests any more), with its timings beside it."""
    table = tuned.load()
    for device, entries in table.items():
        for key, entry in entries.items():
            dtype, shape = key.split(" ")
            n_out, n_in = map(int, shape.split("x"))
            assert dtype in ("bfloat16", "float16"), (device, key)
            assert entry["us"] > 0 and entry["cublas_us"] >= entry["us"], (device, key, entry)
            if entry["config"] is not None:
                assert gemm.GemmConfig(**entry["config"]) in gemm.configs(n_out, n_in), (device, key)


def test_the_tuning_script_needs_a_gpu_and_says_so(tmp_path):
    """Without CUDA ``scripts/tune_decode_gemms.py`` is a usage error that says why, and writes no table."""
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would tune it")
    script = Path(__file__).resolve().parents[2] / "scripts" / "tune_decode_gemms.py"
    out = tmp_path / "table.json"
    result = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr, result.stderr
    assert not out.exists()
    for batches in (["0", "32"], ["1", "1"], ["65"]):  # refused before it looks for a GPU
        result = subprocess.run([sys.executable, str(script), "--batches", *batches, "--out", str(out)],
                                capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 2 and "--batches: distinct live-row counts from 1 to 64" in result.stderr, batches
    assert not out.exists()
