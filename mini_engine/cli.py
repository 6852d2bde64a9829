"""``mini-engine``: the engine's command line."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import click

from mini_engine import __version__
from mini_engine.constants import STATE_DIGESTS

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mini-engine")
def main() -> None:
    """A compact inference engine for hybrid (Gated DeltaNet + attention) models."""


def engine_options(command):
    """The options every engine command takes: the model, the device and dtype, the scheduling mode, the device
    seed, the decode step's gemms and launches, faults."""
    from mini_engine.constants import DECODE_GEMMS
    from mini_engine.engine.config import DTYPES
    from mini_engine.faults import ALL_FAULTS, FAULTS

    options = [
        click.option("--model", "model_name", default=None, metavar="NAME|DIR",
                     help="Model name (default: probe-tiny, trained; tiny-random: seeded random) or a Hugging Face checkpoint folder."),
        click.option("--device", type=click.Choice(["sim", "cuda"]), default="sim", show_default=True,
                     callback=_check_device,
                     help="Where the engine runs: the simulated device (CPU) or a GPU (real CUDA streams, the "
                          "Triton kernels, CUDA graphs for decode)."),
        click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True,
                     help="The projections' weights (bfloat16 halves what a decode step reads; not bit-exact)."),
        click.option("--overlap", is_flag=True, help="Overlap scheduling: build batch N+1 while batch N runs."),
        click.option("--device-seed", type=int, default=0, show_default=True,
                     help="Seed of the device: the simulated device's schedule; on cuda 0 keeps the GPU's own "
                          "timing and any other seed adds seeded stream delays."),
        click.option("--decode-gemm", type=click.Choice(DECODE_GEMMS), default="tuned", show_default=True,
                     help="On cuda, the decode step's 16-bit projections (--dtype bfloat16): cuBLAS, the Triton decode "
                          "gemm, per weight whichever timed fastest at start (auto: 1-6 s more to start, and the "
                          "choice may differ between processes), or the choice measured ahead of time for this GPU "
                          "model (tuned; cuBLAS where the package's table has none)."),
        click.option("--decode-gemm-table", type=click.Path(exists=True, dir_okay=False), default=None,
                     metavar="FILE", help="With --decode-gemm tuned, the choices from this table "
                                          "(scripts/tune_decode_gemms.py --out FILE on this GPU) instead of the "
                                          "package's."),
        click.option("--decode-pdl/--no-decode-pdl", default=None,
                     help="On cuda, launch the decode step's Triton kernels as programmatic dependent launches (the "
                          "same bits; 14 % more tokens/s at batch 1 on an H100 with the Triton gemms). Default: on "
                          "where the GPU can (Hopper on)."),
        click.option("--fault", "faults", multiple=True, type=click.Choice(list(ALL_FAULTS)), metavar="NAME",
                     help=f"Switch one safeguard off (repeatable): {', '.join(FAULTS)}; outside the catalogue: "
                          f"{', '.join(k for k in ALL_FAULTS if k not in FAULTS)}."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _check_device(ctx, param, value: str) -> str:
    """--device cuda on a machine without a GPU is refused before anything loads."""
    from mini_engine.device import unavailable

    reason = unavailable(value)
    if reason:
        raise click.BadParameter(reason, ctx=ctx, param=param)
    return value


def _check_fresh_ledger(ctx, param, value: Path | None) -> Path | None:
    """serve --ledger: a ledger is one server's rows (their seq counts from 1), so a file that already holds rows is
    refused rather than appended to: two servers' rows in one file would read as one stream."""
    if value is not None and value.exists() and value.stat().st_size:
        with value.open("rb") as handle:
            rows = sum(1 for _ in handle)
        raise click.BadParameter(f"{value} already holds {rows} rows (another server's ledger); give this server a new "
                                 f"file, or remove that one", ctx=ctx, param=param)
    return value


def build_engine(model_name: str | None, *, sink=None, **config):
    """An engine over the named model (``sink``: where its slot ledger rows go); a bad model or setting is a click
    error naming its option."""
    from mini_engine.engine import Engine, EngineConfig
    from mini_engine.model import CheckpointError, load_model

    try:
        engine_config = EngineConfig(**config)
    except ValueError as err:
        field = re.match(r"EngineConfig\.(\w+)", str(err))
        hint = f"--{field.group(1).replace('_', '-')}" if field else None
        raise click.BadParameter(str(err), param_hint={"--faults": "--fault"}.get(hint, hint)) from None
    try:
        model = load_model(model_name)
    except (CheckpointError, ValueError) as err:
        raise click.BadParameter(str(err), param_hint="--model") from None
    return Engine(engine_config, model=model, sink=sink)


@main.command()
@click.option("--prompt", required=True, help="Text to continue (or the user message with --chat).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="Most tokens to generate.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the chat template as a user turn.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Send the same prompt this many times, one after another (the later ones hit the cache).")
@engine_options
def generate(prompt: str, model_name: str | None, max_tokens: int, chat: bool, repeat: int, device: str, dtype: str,
             overlap: bool, device_seed: int, decode_gemm: str, decode_gemm_table: str | None,
             decode_pdl: bool | None, faults: tuple[str, ...]) -> None:
    """Greedy generation through the engine (prefix cache on), printing cached_tokens per run."""
    from mini_engine.engine import SamplingParams

    if not prompt:
        raise click.BadParameter("must not be empty", param_hint="--prompt")
    engine = build_engine(model_name, device=device, dtype=dtype, overlap=overlap, device_seed=device_seed,
                          decode_gemm=decode_gemm, decode_gemm_table=decode_gemm_table, decode_pdl=decode_pdl,
                          faults=faults)
    model = engine.model
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=engine.tokenizer.eos_token_ids)
    click.echo(f"model: {model.config.name}  device: {engine.device.name} (seed {device_seed})  dtype: {dtype}  "
               f"faults: {', '.join(sorted(engine.config.faults)) or 'none'}")
    for run in range(1, repeat + 1):
        started = time.perf_counter()
        rid = engine.submit(text, params)
        engine.run()
        result, elapsed = engine.result(rid), time.perf_counter() - started
        click.echo(f"run {run}: prompt tokens: {result.prompt_tokens}  cached_tokens: {result.cached_tokens}  "
                   f"generated: {len(result.output_ids)} ({result.finish_reason})  {elapsed:.2f} s")
        click.echo(f"  token ids: {list(result.output_ids)}")
        click.echo(f"  text: {engine.tokenizer.decode(result.output_ids, skip_special=True)!r}")


@main.command()
@engine_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port to bind.")
@click.option("--api-key", default=None, envvar="MINI_ENGINE_API_KEY",
              help="Require 'Authorization: Bearer KEY' on /v1 and /debug (env MINI_ENGINE_API_KEY).")
@click.option("--served-model-name", default=None, help="Model id clients send (default: the model's name).")
@click.option("--max-running", type=click.IntRange(min=1), default=8, show_default=True,
              help="Most requests (choices) prefilled or decoded at once.")
@click.option("--num-slots", type=click.IntRange(min=1), default=96, show_default=True,
              help="Linear-state slots (each running request holds three; the rest hold cached snapshots).")
@click.option("--num-pages", type=click.IntRange(min=1), default=1024, show_default=True, help="KV pages.")
@click.option("--max-context", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Most tokens per request, prompt and generation together.")
@click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              callback=_check_fresh_ledger,
              help="Write the slot ledger here, a JSON row a line (with each donation's cold reference state, a "
                   "prefill each), a new or empty file: one server's rows (`hammer analyze RUN --ledger-log FILE` "
                   "attributes an HTTP run from it). The responses then also carry the checks of the logits each "
                   "token was sampled from.")
@click.option("--state-digests", type=click.Choice(STATE_DIGESTS), default="tracked", show_default=True,
              help="With --ledger, how a forward's live-slot digests read the slot: tracked (a decode step reads "
                   "conv and its new row, rec once a chunk; a write that bypasses the engine's storage shows a chunk "
                   "later) or readback (every byte every step, 16.6x the bytes at the 0.8B shape).")
def serve(model_name: str | None, device: str, dtype: str, overlap: bool, device_seed: int, decode_gemm: str,
          decode_gemm_table: str | None, decode_pdl: bool | None, faults: tuple[str, ...], host: str, port: int,
          api_key: str | None, served_model_name: str | None, max_running: int, num_slots: int,
          num_pages: int, max_context: int, ledger: Path | None, state_digests: str) -> None:
    """Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models) until SIGINT / SIGTERM."""
    from mini_engine.server import create_app, serve as run_server

    rows = None if ledger is None else ledger.open("w", encoding="utf-8", buffering=1)  # a line a row, as written
    engine = build_engine(model_name, device=device, dtype=dtype, overlap=overlap, device_seed=device_seed,
                          decode_gemm=decode_gemm, decode_gemm_table=decode_gemm_table, decode_pdl=decode_pdl,
                          faults=faults, max_running=max_running,
                          num_slots=num_slots, num_pages=num_pages, max_context=max_context,
                          reference_states=rows is not None, state_digests=state_digests,
                          sink=None if rows is None else lambda row: rows.write(json.dumps(row, default=str) + "\n"))
    if device == "cuda":  # the first requests would otherwise compile the kernels and capture the graphs
        warm = engine.warm_up()
        click.echo(f"warmed up: {warm['requests']} requests, {warm['cuda_graphs']} CUDA graphs, "
                   f"{warm['seconds']:.1f} s")
    click.echo(f"model: {engine.model.config.name}  device: {engine.device.name} (seed {device_seed})  "
               f"dtype: {dtype}  "
               f"faults: {', '.join(sorted(engine.config.faults)) or 'none'}"
               + (f"  ledger: {ledger}" if ledger else "") + f"  listening on http://{host}:{port}")
    try:
        run_server(create_app(engine, served_model_name=served_model_name, api_key=api_key), host=host, port=port)
    finally:
        if rows is not None:
            rows.close()


@main.command()
@click.option("--recipe", "recipe_name", default="probe-tiny", show_default=True, metavar="NAME",
              help="Training recipe: the model shape, the probe mix and the schedule.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder for the checkpoint and logs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights and of the data.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Optimiser steps (default: the recipe's).")
@click.option("--time-limit", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Stop after this long; the learning-rate schedule follows whichever of steps and time runs out first.")
@click.option("--device", default=None, help="torch device (default: cuda if available, else cpu).")
@click.option("--final-eval", type=click.IntRange(min=0), default=64, show_default=True,
              help="Validation probes per family after training (greedy, recomputed).")
@click.option("--mix", default=None, metavar="FAMILY=N,...",
              help="Examples of each family per step, replacing the recipe's mix (e.g. arithmetic=32,media=16).")
@click.option("--init", "init_from", type=click.Path(exists=True, file_okay=False), default=None,
              help="Continue from this checkpoint (written by an earlier train) instead of fresh weights.")
def train(recipe_name: str, out: str, seed: int, steps: int | None, time_limit: float | None, device: str | None,
          final_eval: int, mix: str | None, init_from: str | None) -> None:
    """Train a hybrid model on the probe grammar and save a Hugging Face-style checkpoint in OUT."""
    import torch

    from dataclasses import replace

    from mini_engine.train import get_recipe, parse_mix
    from mini_engine.train.loop import earlier_stages, train as run_training

    try:
        recipe = get_recipe(recipe_name)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--recipe") from None
    if mix is not None:
        try:
            recipe = replace(recipe, mix=parse_mix(mix))
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--mix") from None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, ValueError) as err:
        raise click.BadParameter(f"{device!r} is not a usable torch device here ({err})", param_hint="--device") from None
    try:
        earlier_stages(init_from)
    except (ValueError, KeyError) as err:
        raise click.BadParameter(str(err), param_hint="--init") from None
    result = run_training(recipe, out, seed=seed, steps=steps, device=device, time_limit=time_limit,
                          final_eval=final_eval, init=init_from, echo=click.echo)
    click.echo(f"{result.steps} steps in {result.wall_s:.0f} s; answer loss {result.first_loss:.3f} -> "
               f"{result.last_loss:.3f}; validation accuracy "
               + ", ".join(f"{f} {a:.1%}" for f, a in result.accuracy.items()))
    click.echo(f"checkpoint: {result.folder}")
