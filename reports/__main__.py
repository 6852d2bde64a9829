"""``python -m reports report|compare|plan``: the report commands before the ``hammer`` CLI mounts them."""

import click

from reports.cli import COMMANDS


@click.group()
def main() -> None:
    """Reports of stored run directories: report, compare, plan."""


for command in COMMANDS:
    main.add_command(command)

if __name__ == "__main__":
    main()
