"""``mini-engine``: the engine's command line."""

from __future__ import annotations

import time

import click

from mini_engine import __version__

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mini-engine")
def main() -> None:
    """A compact inference engine for hybrid (Gated DeltaNet + attention) models."""


@main.command()
@click.option("--prompt", required=True, help="Text to continue (or the user message with --chat).")
@click.option("--model", "model_name", default=None, metavar="NAME|DIR",
              help="Built-in model name (default: tiny-random) or a Hugging Face checkpoint folder.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="Most tokens to generate.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the chat template as a user turn.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Send the same prompt this many times, one after another (the later ones hit the cache).")
@click.option("--overlap", is_flag=True, help="Overlap scheduling: build batch N+1 while batch N runs.")
@click.option("--device-seed", type=int, default=0, show_default=True, help="Seed of the simulated device.")
def generate(prompt: str, model_name: str | None, max_tokens: int, chat: bool, repeat: int, overlap: bool,
             device_seed: int) -> None:
    """Greedy generation through the engine (prefix cache on), printing cached_tokens per run."""
    from mini_engine.engine import Engine, EngineConfig, SamplingParams
    from mini_engine.model import CheckpointError, load_model

    if not prompt:
        raise click.BadParameter("must not be empty", param_hint="--prompt")
    try:
        model = load_model(model_name)
    except (CheckpointError, ValueError) as err:
        raise click.BadParameter(str(err), param_hint="--model") from None
    engine = Engine(EngineConfig(overlap=overlap, device_seed=device_seed), model=model)
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=engine.tokenizer.eos_token_ids)
    click.echo(f"model: {model.config.name}  device: {engine.device.name} (seed {device_seed})")
    for run in range(1, repeat + 1):
        started = time.perf_counter()
        rid = engine.submit(text, params)
        engine.run()
        result, elapsed = engine.result(rid), time.perf_counter() - started
        click.echo(f"run {run}: prompt tokens: {result.prompt_tokens}  cached_tokens: {result.cached_tokens}  "
                   f"generated: {len(result.output_ids)} ({result.finish_reason})  {elapsed:.2f} s")
        click.echo(f"  token ids: {list(result.output_ids)}")
        click.echo(f"  text: {engine.tokenizer.decode(result.output_ids, skip_special=True)!r}")
