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
def generate(prompt: str, model_name: str | None, max_tokens: int, chat: bool) -> None:
    """Greedy generation straight on the model (no cache manager yet)."""
    from mini_engine.generate import greedy_generate
    from mini_engine.model import ByteTokenizer, CheckpointError, load_model

    try:
        model = load_model(model_name)
    except (CheckpointError, ValueError) as err:
        raise click.BadParameter(str(err), param_hint="--model") from None
    if not prompt:
        raise click.BadParameter("must not be empty", param_hint="--prompt")
    started = time.perf_counter()
    result = greedy_generate(model, ByteTokenizer(), prompt, max_tokens, chat=chat)
    elapsed = time.perf_counter() - started
    click.echo(f"model: {model.config.name}  prompt tokens: {result.prompt_tokens}  "
               f"generated: {len(result.token_ids)} ({result.finish_reason})  {elapsed:.2f} s")
    click.echo(f"token ids: {result.token_ids}")
    click.echo(f"text: {result.text!r}")
