"""Live progress of a soak on the terminal: rounds, requests done, hits, corrupted, request rate.

Rich draws it on stderr when stderr is a terminal; otherwise (CI logs, pipes, tests) it is off and
costs nothing. It only listens: ``update(round, counts)`` after each round.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

__all__ = ["Progress"]


class Progress:
    def __init__(self, *, enabled: bool | None = None, total: int | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total, self.counts, self.rounds = total, Counter(), 0
        self._started = time.monotonic()
        self._live: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._render(), console=Console(stderr=True), refresh_per_second=2)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def __call__(self, round_index: int, counts: Mapping[str, int]) -> None:
        """A round ended with these verdict counts."""
        self.rounds = round_index
        self.counts.update(counts)
        if self._live is not None:
            self._live.update(self._render())

    def line(self) -> str:
        c, elapsed = self.counts, max(time.monotonic() - self._started, 1e-9)
        done = f"{c['hammer']}/{self.total}" if self.total else str(c["hammer"])
        return (f"round {self.rounds}  done {done}  hits {c['hits']}  abandoned {c['abandoned']}  "
                f"corrupted {c['corrupted']} ({c['corrupted_hits']} on hits)  {c['hammer'] / elapsed:.2f} req/s")

    def _render(self) -> Any:
        from rich.text import Text

        return Text(self.line(), style="bold red" if self.counts["corrupted"] else "")
