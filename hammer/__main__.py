"""``python -m hammer``: the ``hammer`` command, where the package is importable but not installed (a plain checkout on a
GPU machine, with ``PYTHONPATH``)."""

from hammer.cli import main

main(prog_name="hammer")
