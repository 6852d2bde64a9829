"""``hammer``: the harness's command line (DESIGN.md §5). Subcommands arrive as they are built."""

from __future__ import annotations

import click

from hammer import __version__

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hammer")
def main() -> None:
    """Hammer an inference engine's prefix cache and attribute every wrong answer on a hit."""
