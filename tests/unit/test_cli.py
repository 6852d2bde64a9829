"""The command lines work, fail with errors naming the option, and the README's commands match CI's."""

import re
from pathlib import Path

from click.testing import CliRunner

from hammer.cli import main as hammer_main
from mini_engine.cli import main as engine_main
from mini_engine.generate import greedy_generate
from mini_engine.model import load_model

ROOT = Path(__file__).resolve().parents[2]


def test_generate_prints_tokens_and_matches_the_library(tokenizer):
    """`mini-engine generate` prints the same greedy tokens the default model computes cold and alone."""
    result = CliRunner().invoke(engine_main, ["generate", "--prompt", "Hello there", "--max-tokens", "6"])
    assert result.exit_code == 0, result.output
    expected = greedy_generate(load_model(), tokenizer, "Hello there", 6)
    assert f"token ids: {expected.token_ids}" in result.output
    assert f"generated: {len(expected.token_ids)} ({expected.finish_reason})" in result.output


def test_generate_repeat_hits_the_cache(tokenizer):
    """--repeat 2 of a prompt spanning a 64-boundary reports cached_tokens 0, then 128, with identical tokens."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 3  # 135 bytes
    result = CliRunner().invoke(engine_main, ["generate", "--prompt", prompt, "--max-tokens", "5", "--repeat", "2"])
    assert result.exit_code == 0, result.output
    cached = re.findall(r"cached_tokens: (\d+)", result.output)
    assert cached == ["0", "128"]
    ids = re.findall(r"token ids: (\[.*\])", result.output)
    assert ids[0] == ids[1] == str(greedy_generate(load_model(), tokenizer, prompt, 5).token_ids)


def test_generate_bad_options_name_the_option(tmp_path):
    """A bad model folder, a zero max-tokens, an empty prompt and a gemm table that is missing or given with another
    choice each name their option."""
    runner = CliRunner()
    bad_model = runner.invoke(engine_main, ["generate", "--prompt", "x", "--model", str(tmp_path)])
    assert bad_model.exit_code == 2 and "--model" in bad_model.output
    zero = runner.invoke(engine_main, ["generate", "--prompt", "x", "--max-tokens", "0"])
    assert zero.exit_code == 2 and "--max-tokens" in zero.output
    empty = runner.invoke(engine_main, ["generate", "--prompt", ""])
    assert empty.exit_code == 2 and "--prompt" in empty.output
    table = ["generate", "--prompt", "x", "--decode-gemm-table"]
    absent = runner.invoke(engine_main, [*table, str(tmp_path / "absent.json")])
    assert absent.exit_code == 2 and "--decode-gemm-table" in absent.output and "does not exist" in absent.output
    (tmp_path / "table.json").write_text("{}")
    not_tuned = runner.invoke(engine_main, [*table, str(tmp_path / "table.json"), "--decode-gemm", "cublas"])
    assert not_tuned.exit_code == 2 and "--decode-gemm-table" in not_tuned.output
    assert "'tuned' alone" in not_tuned.output


def test_hammer_cli_has_help_and_version():
    """`hammer` is a working click group."""
    result = CliRunner().invoke(hammer_main, ["--version"])
    assert result.exit_code == 0 and "hammer" in result.output


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    """The README's first two commands install and run; CI runs the second one's test command verbatim."""
    main_job, tests = readme_commands()[:2]
    assert "pip install torch==2.13.0" in main_job and "hammer soak" in main_job
    test_command = tests.split("&&")[-1].strip()
    assert test_command.startswith("pytest")
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
    assert "set -euo pipefail" in ci_lines
