"""The options of ``hammer``'s commands: their declarations, the callbacks that parse them, and the split of a
run's options into the embedded engine's and the HTTP target's (``hammer.cli`` declares the commands)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

__all__ = ["DEFAULT_PATTERNS", "DEVICE_OPTION", "DEVICE_SEED_OPTION", "DTYPE_OPTION", "ENGINE_FLAGS", "HTTP_FLAGS",
           "MODEL_OPTION", "REPORT_OPTION", "check_device", "check_model", "duration", "parse_settings", "run_options",
           "split_options"]

DEFAULT_PATTERNS = ("alternate-abandon", "saturate", "follow-up", "branch-fanout", "chunk-boundary", "multi-turn",
                    "media-ab", "donate-hit")
ENGINE_FLAGS = {"model": "--model", "faults": "--fault", "overlap": "--overlap", "device": "--device",
                "device_seed": "--device-seed", "dtype": "--dtype", "max_running": "--max-running",
                "num_slots": "--num-slots", "num_pages": "--num-pages", "page_size": "--page-size",
                "state_digests": "--state-digests"}
HTTP_FLAGS = {"api_key": "--api-key", "headers": "--header", "model": "--model", "control_url": "--control-url",
              "timeout": "--timeout", "exact": "--exact/--inexact", "request_id_field": "--request-id-field"}


MODEL_OPTION = click.option(
    "--model", default=None, metavar="NAME|DIR",
    help="[embedded] The engine's model: probe-tiny (default, trained), tiny-random, qwen3.5-0.8b-shaped-random (the "
         "production size, for --device cuda) or a Hugging Face checkpoint folder. [http] The model name to ask for "
         "(default: the server's first).")


def duration(_ctx, _param, value: str | None) -> float | None:
    if value is None:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", value.strip())
    if not match:
        raise click.BadParameter("use a number of seconds, or e.g. 90s, 10m, 2h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def _seed(_ctx, _param, value: str) -> int | str:
    if value == "last":
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter("an integer, or 'last' to reuse the seed of runs/last") from None


def _target(_ctx, _param, value: str) -> str:
    if value == "embedded" or re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        return value
    raise click.BadParameter("'embedded', or the URL of an OpenAI-compatible server (http://127.0.0.1:8000)")


def _headers(_ctx, _param, values: tuple[str, ...]) -> dict[str, str]:
    headers = {}
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{value!r}: use NAME:VALUE, e.g. 'X-Team: harness'")
        headers[name.strip()] = content.strip()
    return headers


def _field_name(_ctx, _param, value: str | None) -> str | None:
    from hammer.targets.http import RESERVED_FIELDS

    if value is not None and (not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value) or value in RESERVED_FIELDS):
        raise click.BadParameter(f"{value!r}: a JSON field name that the OpenAI request does not already use "
                                 f"(such as rid)")
    return value


def parse_settings(_ctx, _param, values: tuple[str, ...]) -> tuple[tuple[str, object], ...]:
    """``key=value`` pairs; a value is read as JSON when it parses (numbers, lists -> tuples), else as text."""
    settings = {}
    for value in values:
        key, sep, raw = value.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"{value!r}: use key=value, e.g. --set abandon_after=3")
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = raw
        settings[key] = tuple(parsed) if isinstance(parsed, list) else parsed
    return tuple(sorted(settings.items()))


REPORT_OPTION = click.option("--report/--no-report", default=True, show_default=True,
                             help="Write RUN_DIR/report/ (report.md, report.html, plots, CSV, Parquet) at the end.")
DEVICE_OPTION = click.option("--device", type=click.Choice(["sim", "cuda"]), default=None,
                             help="[embedded] Where the engine runs: the simulated device (default) or a GPU "
                                  "(real CUDA streams).")
DEVICE_SEED_OPTION = click.option(
    "--device-seed", type=int, default=0, show_default=True,
    help="[embedded] Seed of the device (round r uses seed + r): the simulated device's schedule; on cuda 0 "
         "keeps the GPU's own timing and any other seed adds seeded stream delays (the nemesis).")

DTYPE_OPTION = click.option(
    "--dtype", type=click.Choice(["float32", "bfloat16"]), default=None,
    help="[embedded] The engine's projection weights (default float32; bfloat16 is not bit-exact: hits are "
         "judged by ground truth, not against their controls' bits).")


def run_options(command):
    """What every running command takes: the target, the seed, the output, engine and HTTP options, verdicts."""
    from mini_engine.constants import STATE_DIGESTS
    from mini_engine.faults import ALL_FAULTS, FAULTS

    positive = click.IntRange(min=1)
    options = [
        click.option("--target", default="embedded", show_default=True, callback=_target, metavar="embedded|URL",
                     help="The in-process engine, or the base URL of an OpenAI-compatible server."),
        click.option("--seed", default="0", callback=_seed, show_default=True, help="Schedule seed, or 'last'."),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
                     help="Root folder of run directories."),
        click.option("--concurrency", type=positive, default=None, help="Most requests open at once (default: any)."),
        click.option("--max-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
                     help="Corrupted-hit rate above which the exit code is 1."),
        click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Also write JUnit XML here."),
        REPORT_OPTION,
        click.option("--fault", "faults", multiple=True, type=click.Choice(list(ALL_FAULTS)), metavar="NAME",
                     help=f"[embedded] Switch one engine safeguard off (repeatable): {', '.join(FAULTS)}; "
                          f"outside the catalogue: "
                          f"{', '.join(k for k in ALL_FAULTS if k not in FAULTS)}."),
        click.option("--overlap", is_flag=True, help="[embedded] Overlap scheduling in the engine under test."),
        DEVICE_OPTION,
        DEVICE_SEED_OPTION,
        DTYPE_OPTION,
        click.option("--max-running", type=positive, default=None, help="[embedded] Requests batched at once."),
        click.option("--num-slots", type=positive, default=None, help="[embedded] Linear-state slots."),
        click.option("--num-pages", type=positive, default=None, help="[embedded] KV pages."),
        click.option("--page-size", type=click.Choice(["1", "2", "4", "8", "16", "32", "64"]), default=None,
                     help="[embedded] Tokens per KV page (finish donations land on page-aligned lengths)."),
        click.option("--state-digests", type=click.Choice(STATE_DIGESTS), default=None,
                     help="[embedded] How the ledger digests the live slots a forward wrote: tracked (the engine's "
                          "default: a decode step reads conv and its new row) or readback (every byte every step, "
                          "which also sees a write that bypasses the engine's storage at the next step)."),
        click.option("--api-key", default=None, envvar="HAMMER_API_KEY",
                     help="[http] Sent as 'Authorization: Bearer KEY' (env HAMMER_API_KEY)."),
        click.option("--header", "headers", multiple=True, callback=_headers, metavar="NAME:VALUE",
                     help="[http] An extra request header (repeatable)."),
        MODEL_OPTION,
        click.option("--control-url", default=None, metavar="URL",
                     help="[http] Run the cold controls here: a second server with its prefix cache off."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True,
                     help="[http] Seconds a request may wait for its next bytes."),
        click.option("--request-id-field", default=None, metavar="NAME", callback=_field_name,
                     help="[http] Also send each request's id in the body under NAME, for a server that names its "
                          "requests from the body (SGLang: rid); every request already carries it as X-Request-Id "
                          "(vLLM, mini-engine). Either way the server's ledger rows can be matched to the run."),
        click.option("--exact/--inexact", default=None,
                     help="[http] Count a hit that differs from its control as corruption (default: yes for "
                          "mini-engine servers whose /v1/models card says bit_exact, i.e. on the sim device; "
                          "no for others)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def check_device(device: str | None) -> None:
    """--device cuda on a machine without a GPU is refused before a run directory exists."""
    from mini_engine.device import unavailable

    reason = unavailable(device or "sim")
    if reason:
        raise click.BadParameter(reason, param_hint="--device")


def check_model(name: str | None) -> None:
    """An embedded engine's --model that names no model is refused before a run directory exists."""
    from mini_engine.model import check_model_name

    try:
        check_model_name(name)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--model") from None


def split_options(options: dict) -> tuple[dict, dict]:
    """(engine options, HTTP options) for the chosen target; an option of the other target is an error."""
    ctx = click.get_current_context()
    embedded = options["target"] == "embedded"
    given = {name for name in (*ENGINE_FLAGS, *HTTP_FLAGS)
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    own, other = (ENGINE_FLAGS, HTTP_FLAGS) if embedded else (HTTP_FLAGS, ENGINE_FLAGS)
    wrong = sorted(given & (set(other) - set(own)))  # --model is both targets' own
    if wrong:
        flags = HTTP_FLAGS if embedded else ENGINE_FLAGS
        raise click.BadParameter(f"{flags[wrong[0]]} applies to the {'http' if embedded else 'embedded'} target "
                                 f"only; this run's --target is {options['target']}", param_hint=flags[wrong[0]])
    engine = {name: options[name] for name in ENGINE_FLAGS if options[name] is not None}
    check_device(engine.get("device"))
    if embedded:
        check_model(engine.get("model"))
    if "page_size" in engine:
        engine["page_size"] = int(engine["page_size"])
    return engine, {name: options[name] for name in HTTP_FLAGS if options[name] is not None}


