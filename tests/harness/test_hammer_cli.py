"""The hammer CLI end to end on the embedded engine: soak, analyze, replay, resume, exit codes, bad options."""

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from forensics import RunDir
from hammer.cli import main

SMALL = ["--pattern", "alternate-abandon", "--round-size", "6"]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    result = CliRunner().invoke(main, ["soak", "--requests", "12", *SMALL, "--out", str(out), "--seed", "5",
                                       "--junit", str(out / "junit.xml")])
    return out, result


def test_clean_soak_exits_0_with_summary_junit_and_attribution(clean_run):
    """A clean engine: exit 0, the summary table, summary.json with hits and no corruption, JUnit without failures."""
    out, result = clean_run
    assert result.exit_code == 0, result.output
    assert "verdict             CLEAN" in result.output and "seed 5" in result.output
    summary = json.loads((out / "last" / "summary.json").read_text())
    assert summary["counts"]["hits"] > 0 and summary["counts"]["abandoned"] > 0 and summary["corrupted"] == []
    assert 'failures="0"' in (out / "junit.xml").read_text()
    assert json.loads((out / "last" / "attribution.json").read_text())["verdicts"] == []
    report = out / "last" / "report"
    assert f"report: {report.resolve() / 'report.html'}" in result.output or f"report: {report / 'report.html'}" in result.output
    assert {"report.md", "report.html", "requests.parquet", "rates.csv"} <= {p.name for p in report.iterdir()}
    assert (report / "report.md").read_text().splitlines()[2].startswith("**CLEAN")


def test_replay_reproduces_every_token_and_analyze_rejudges(clean_run):
    """replay re-executes the stored run token for token; analyze re-judges it with the same verdict."""
    out, _ = clean_run
    runner = CliRunner()
    replayed = runner.invoke(main, ["replay", str(out / "last")])
    assert replayed.exit_code == 0 and "every token identical" in replayed.output
    analyzed = runner.invoke(main, ["analyze", str(out / "last")])
    assert analyzed.exit_code == 0 and "CLEAN" in analyzed.output


def test_resume_continues_with_fresh_rounds_and_seed_last(clean_run, tmp_path):
    """--resume adds the next rounds to the same history without reusing a request id; --seed last reuses the seed."""
    out, _ = clean_run
    run = RunDir.open(out / "last")
    before = sum(e["type"] == "invoke" for e in run.history())
    meta = json.loads((run.path / "meta.json").read_text())
    meta["extra"]["requests"] = 18
    (run.path / "meta.json").write_text(json.dumps(meta))
    resumed = CliRunner().invoke(main, ["soak", "--resume", str(run.path)])
    assert resumed.exit_code == 0, resumed.output
    invokes = [e["request"] for e in run.history() if e["type"] == "invoke"]
    assert len(invokes) > before and len(invokes) == len(set(invokes))
    again = CliRunner().invoke(main, ["run", "alternate-abandon", "--count", "2", "--seed", "last", "--out", str(out)])
    assert again.exit_code == 0 and "seed 5" in again.output


@pytest.mark.parametrize("args, option", [
    (["soak", "--duration", "ten minutes"], "--duration"),
    (["soak", "--seed", "x"], "--seed"),
    (["soak", "--fault", "nope"], "--fault"),
    (["soak", "--target", "http://127.0.0.1:1"], "--target"),
    (["soak", "--max-rate", "2"], "--max-rate"),
])
def test_bad_options_name_the_option(args, option):
    """Each bad option is a usage error (exit 2) naming it."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and option in result.output, result.output


def test_a_planted_writer_bug_exits_1_and_is_attributed(tmp_path):
    """--fault track_writer=off: corrupted hits only, exit 1, and the ledger attributes them bad-at-donate."""
    result = CliRunner().invoke(main, ["soak", "--requests", "6", *SMALL, "--fault", "track_writer=off",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    summary = json.loads((tmp_path / "last" / "summary.json").read_text())
    assert summary["counts"]["corrupted"] == summary["counts"]["corrupted_hits"] > 0
    assert set(summary["attribution"]) == {"bad-at-donate"}
    assert summary["hypotheses"]["poisoned-after-donate"] == "falsified"
    assert "bad-at-donate" in (tmp_path / "last" / "report" / "report.md").read_text()


def test_report_compare_and_plan_are_hammer_commands(clean_run, tmp_path):
    """The reports commands are mounted: `hammer plan` prints the rule-of-three count, `hammer compare` of a
    clean run against itself is "not shown fixed" (exit 1), and --no-report leaves no report folder."""
    out, _ = clean_run
    planned = CliRunner().invoke(main, ["plan", "--base-rate", "0.1"])
    assert planned.exit_code == 0 and "clean trials to claim a fix: 29" in planned.output
    compared = CliRunner().invoke(main, ["compare", str(out / "last"), str(out / "last"), "--out", str(tmp_path / "c")])
    assert compared.exit_code == 1 and "verdict: not shown fixed" in compared.output
    bare = CliRunner().invoke(main, ["run", "alternate-abandon", "--count", "2", "--no-report", "--out", str(tmp_path)])
    assert bare.exit_code == 0 and not (tmp_path / "last" / "report").exists()


def test_probe_asks_each_probe_cold_then_as_a_hit(tmp_path):
    """`hammer probe arithmetic`: every probe twice, the repeat a hit; clean exit; the source is named in meta."""
    result = CliRunner().invoke(main, ["probe", "arithmetic", "--count", "4", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "last" / "summary.json").read_text())
    assert summary["counts"]["hammer"] == 4 and summary["counts"]["hits"] >= 2
    assert json.loads((tmp_path / "last" / "meta.json").read_text())["patterns"][0]["name"] == "probe:arithmetic"


def test_run_takes_pattern_settings_and_replay_checks_one_request(tmp_path):
    """--set abandon_after=2 reaches the pattern; replay --request reruns that request's round: identical."""
    result = CliRunner().invoke(main, ["run", "alternate-abandon", "--count", "4", "--set", "abandon_after=2",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = RunDir.open(tmp_path / "last")
    ends = [e for e in run.history() if e["type"] == "info"]
    assert ends and all(e["tokens_received"] == 2 for e in ends)
    replayed = CliRunner().invoke(main, ["replay", str(run.path), "--request", ends[0]["request"]])
    assert replayed.exit_code == 0 and "every token identical" in replayed.output, replayed.output


def test_replay_names_the_first_token_that_differs(clean_run, tmp_path):
    """A stored history with one token changed: replay exits 1 naming the request and the position."""
    out, _ = clean_run
    run = RunDir.open(out / "last")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "meta.json").write_text((run.path / "meta.json").read_text())
    lines = (run.path / "history.jsonl").read_text().splitlines()
    target = next(i for i, line in enumerate(lines) if '"type":"token"' in line and '"position":1,' in line)
    event = json.loads(lines[target])
    event["token_id"] = (event["token_id"] + 1) % 256
    lines[target] = json.dumps(event, separators=(",", ":"))
    (copy / "history.jsonl").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(main, ["replay", str(copy)])
    assert result.exit_code == 1 and f"request {event['request']}" in result.output
    assert "first difference at token 1" in result.output


FOLLOW_UP = ["run", "follow-up", "--count", "16", "--overlap", "--page-size", "1", "--num-pages", "8192", "--seed", "3",
             "--no-report"]


@pytest.fixture(scope="module")
def clean_and_transfer(tmp_path_factory):
    """One follow-up schedule run twice: on the clean engine, and with donate=transfer (its hits corrupted)."""
    root = tmp_path_factory.mktemp("follow-up")
    for name, faults in (("clean", []), ("transfer", ["--fault", "donate=transfer"])):
        result = CliRunner().invoke(main, [*FOLLOW_UP, *faults, "--out", str(root / name)])
        assert result.exit_code == (1 if faults else 0), result.output
    return (root / "clean" / "last").resolve(), (root / "transfer" / "last").resolve()


def test_a_replay_on_the_fixed_engine_names_the_token_and_where_the_state_parted(clean_and_transfer, tmp_path):
    """A donate=transfer run replayed with the fault taken out of its meta.json (the engine fixed): exit 1 naming
    the first request whose tokens or logits differ and where its live state parted from the stored run's, at the
    end of its first forward after the restore (the stored run restored poisoned bytes there)."""
    _, transfer = clean_and_transfer
    assert CliRunner().invoke(main, ["replay", str(transfer)]).exit_code == 0  # unchanged: identical
    fixed_dir = tmp_path / "fixed"
    shutil.copytree(transfer, fixed_dir)
    meta = json.loads((fixed_dir / "meta.json").read_text())
    meta["engine"]["faults"] = meta["faults"] = []
    (fixed_dir / "meta.json").write_text(json.dumps(meta))
    fixed = CliRunner().invoke(main, ["replay", str(fixed_dir)])
    assert fixed.exit_code == 1 and "sampled from other logits" in fixed.output, fixed.output
    assert "the live state first differs at position" in fixed.output and "the end of its first forward" in fixed.output
    assert "in the stored run" in fixed.output and "in the replay run" in fixed.output


def test_diff_compares_two_runs_of_one_schedule(clean_and_transfer, tmp_path):
    """hammer diff: a run against itself is identical (exit 0); the clean run against the transfer run differs at
    a hit, whose state parted at its first forward after the restore (exit 1); runs of two seeds are refused
    (exit 2, naming the seed)."""
    clean, transfer = clean_and_transfer
    same = CliRunner().invoke(main, ["diff", str(clean), str(clean)])
    assert same.exit_code == 0 and "every token identical" in same.output, same.output
    differ = CliRunner().invoke(main, ["diff", str(clean), str(transfer)])
    assert differ.exit_code == 1 and "differ: request follow-up-" in differ.output, differ.output
    assert "the end of its first forward" in differ.output and "in the first run" in differ.output
    other_seed = CliRunner().invoke(main, ["run", "follow-up", "--count", "4", "--seed", "4", "--no-report",
                                           "--out", str(tmp_path)])
    assert other_seed.exit_code == 0, other_seed.output
    refused = CliRunner().invoke(main, ["diff", str(clean), str(tmp_path / "last")])
    assert refused.exit_code == 2 and "they differ in seed (3 and 4)" in refused.output, refused.output


@pytest.mark.parametrize("args, option", [
    (["run", "alternate-abandon", "--header", "no-colon", "--target", "http://127.0.0.1:1"], "--header"),
    (["run", "alternate-abandon", "--set", "no-equals"], "--set"),
    (["run", "alternate-abandon", "--api-key", "k"], "--api-key"),
    (["run", "alternate-abandon", "--target", "http://127.0.0.1:1", "--fault", "donate=transfer"], "--fault"),
    (["run", "alternate-abandon", "--page-size", "3"], "--page-size"),
    (["run", "alternate-abandon", "--state-digests", "sometimes"], "--state-digests"),
    (["run", "alternate-abandon", "--target", "http://127.0.0.1:1", "--state-digests", "readback"], "--state-digests"),
    (["run", "alternate-abandon", "--target", "ftp://x"], "--target"),
    (["run", "no-such-pattern"], "no-such-pattern"),
    (["probe", "no-such-family"], "no-such-family"),
    (["run", "saturate", "--set", "batchx=3"], "batchx"),
])
def test_bad_options_of_the_new_options_name_them(args, option):
    """Each bad option or value is a usage error (exit 2) that names it."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and option in result.output, result.output


def test_read_back_state_digests_are_an_engine_option_of_the_run(tmp_path):
    """--state-digests readback reaches the embedded engine and is kept in meta.json (a replay builds the same
    engine); the ledger names the engine's checksum format."""
    result = CliRunner().invoke(main, ["run", "alternate-abandon", "--count", "4", "--state-digests", "readback",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "last" / "meta.json").read_text())["engine"]["state_digests"] == "readback"
    rows = [json.loads(line) for line in (tmp_path / "last" / "ledger.jsonl").read_text().splitlines()]
    assert {r["state"] for r in rows if r["type"] == "checksum_format"} == {"hash32x2:conv|rec|rows-by-token"}


def test_a_harness_crash_exits_2_and_keeps_the_run_directory(tmp_path, monkeypatch):
    """An exception inside the run (a harness bug) is exit 2 with a message; the history written so far stays."""
    import hammer.soak

    def crash(*args, **kwargs):
        raise RuntimeError("interpreter bug")

    monkeypatch.setattr(hammer.soak, "run_ops", crash)
    result = CliRunner().invoke(main, ["run", "alternate-abandon", "--count", "2", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "harness error: RuntimeError: interpreter bug" in result.output
    assert (tmp_path / "last" / "history.jsonl").exists()


def test_progress_adds_up_rounds_and_is_off_without_a_terminal():
    """Progress sums each round's counts into done / hits / corrupted / rate, and draws nothing off a TTY."""
    from hammer.progress import Progress

    with Progress(total=10) as progress:
        assert progress.enabled is False  # CliRunner and pytest: stderr is no terminal
        progress(1, {"hammer": 4, "hits": 2, "abandoned": 1, "corrupted": 0, "corrupted_hits": 0})
        progress(2, {"hammer": 4, "hits": 3, "abandoned": 0, "corrupted": 1, "corrupted_hits": 1})
    line = progress.line()
    assert "round 2" in line and "done 8/10" in line and "hits 5" in line and "corrupted 1 (1 on hits)" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: --device cuda is accepted here")
@pytest.mark.parametrize("args", [["soak", "--device", "cuda"], ["run", "saturate", "--device", "cuda"],
                                  ["faults", "--quick", "--device", "cuda"]])
def test_device_cuda_without_a_gpu_is_refused_before_anything_runs(args, tmp_path):
    """--device cuda on a machine without CUDA is a usage error naming --device; no run directory is made."""
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "--device" in result.output and "CUDA" in result.output, result.output
    assert not (tmp_path / "runs").exists()


def test_device_applies_to_the_embedded_target_only():
    result = CliRunner().invoke(main, ["soak", "--device", "sim", "--target", "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "--device applies to the embedded target only" in result.output, result.output


def test_dtype_reaches_the_engine_and_gives_up_bit_exactness(tmp_path):
    """--dtype bfloat16: the embedded engine runs bfloat16 projections (meta.json records it) and the run knows
    its hits are not bit-exact; the http target refuses the option."""
    result = CliRunner().invoke(main, ["run", "saturate", "--count", "4", "--dtype", "bfloat16", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "last" / "meta.json").read_text())
    assert meta["engine"]["dtype"] == "bfloat16"
    assert meta["target"]["exact"] is False
    refused = CliRunner().invoke(main, ["soak", "--dtype", "bfloat16", "--target", "http://127.0.0.1:1"])
    assert refused.exit_code == 2 and "--dtype applies to the embedded target only" in refused.output


@pytest.mark.parametrize("command", [["run", "saturate"], ["faults", "--quick"]])
def test_an_unknown_model_is_refused_before_anything_runs(command, tmp_path):
    """--model naming no built-in, packaged model or folder: a usage error naming --model and the models there are;
    no run directory is made."""
    result = CliRunner().invoke(main, [*command, "--model", "no-such-model", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "--model" in result.output and "tiny-random" in result.output, result.output
    assert not (tmp_path / "runs").exists()


def test_the_model_option_picks_the_embedded_engines_model(tmp_path):
    """--model tiny-random: the embedded engine runs that model (meta.json's target and engine name it); on the
    http target the same option names the model to ask for and is no engine option."""
    result = CliRunner().invoke(main, ["run", "saturate", "--count", "4", "--model", "tiny-random", "--no-report",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "last" / "meta.json").read_text())
    assert meta["target"]["model"] == meta["engine"]["model"] == "tiny-random"
    remote = CliRunner().invoke(main, ["run", "saturate", "--target", "http://127.0.0.1:1", "--model", "served-name",
                                       "--out", str(tmp_path / "remote")])
    assert remote.exit_code == 2 and "cannot reach http://127.0.0.1:1" in remote.output, remote.output
    assert "applies to" not in remote.output and "unknown model" not in remote.output


def test_python_dash_m_hammer_is_the_hammer_command():
    """``python -m hammer`` (a plain checkout, as on the GPU machine) runs the same CLI under the same name."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "hammer", "diff", "--help"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.startswith("Usage: hammer diff"), done.stdout + done.stderr


def test_analyze_counts_state_digests_that_never_landed(clean_run, tmp_path):
    """A stored run whose ledger holds state digests of 0 (an engine whose digests never landed): `hammer analyze`
    keeps its verdict, counts them in summary.json and says so in its table; the clean run itself has none."""
    out, result = clean_run
    assert json.loads((out / "last" / "summary.json").read_text())["ledger_unlanded"] == 0
    assert "never landed" not in result.output
    run = tmp_path / "run"
    shutil.copytree((out / "last").resolve(), run)
    rows = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    blinded = 0
    for row in rows:
        if row["type"] == "slot_write" and blinded < 3:
            row["checksum"], blinded = 0, blinded + 1
    (run / "ledger.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    analyzed = CliRunner().invoke(main, ["analyze", str(run)])
    assert analyzed.exit_code == 0 and "CLEAN" in analyzed.output, analyzed.output
    assert blinded == 3 and json.loads((run / "summary.json").read_text())["ledger_unlanded"] == 3
    assert "3 state digest(s) read 0: they never landed" in analyzed.output
    assert json.loads((run / "attribution.json").read_text())["ledger_unlanded"] == 3
    reported = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "report")])
    assert reported.exit_code == 0, reported.output
    assert "Ledger: 3 state digest(s) read 0: they never landed" in (tmp_path / "report" / "report.md").read_text()
