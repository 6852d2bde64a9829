"""The fault matrix: every fault of the catalogue (and the clean engine) against the patterns that expose it.

A cell is one soak against the embedded engine: one fault (or none), the patterns that should
expose it, the engine options that make its hazard reachable, and the verdict attribution must
give its corrupted hits. ``run_matrix`` runs the cells one after another, each into its own run
directory, and writes ``matrix.json`` (the cells, their run directories, their wall time); the
table (detection, first detection, time to 99% detection, rates with intervals, attribution) is
computed from those run directories by ``reports.matrix``, like every other report.

Why each cell's setting (DESIGN.md §4 gives the signatures):

    donate=transfer        follow-up turns restore the live slot donated at finish; 1-token pages
                           make every early stop page-aligned, overlap keeps a decode in flight
    admission_barrier=off  eight fresh prefixes donated in one step, a hit on each one step later,
                           newest first: the first restores queued race the clones deepest in the
                           copy queue (a race of the device's scheduling, so one wave per round =
                           one device seed each; 16 running admit all the hits at once). Donors ask
                           two tokens: one would free their snapshot slots under the pending clones,
                           and a hit's unfenced restore into such a slot is another bug's signature
                           (freed-in-flight); the hits repeat their donor's request (one control)
    track_writer=off       any hit past a 64-token boundary restores a snapshot nobody wrote
    metadata_fence=off     media A/B keeps changing the decode page tables: a decode reads a table
                           whose upload has not landed
    page_cow=off           every fan-out request samples n = 2 choices that share a partial page, at
                           temperature 4: the choices must sample different tokens into that page,
                           which a trained model's peaked distribution rarely does at 0.8
    evict_locked=on        two running requests and six slots: a late hit and a newcomer admitted
                           together, the newcomer's eviction takes the hit's locked snapshot
    media_key=off          media A/B alternation over the same text
    clean                  every pattern, overlap on, every safeguard on: must find nothing

Outside the catalogue (run only when named):

    restore_rec=off        every pattern, nothing tuned for it
    free_unfenced=on       every pattern missed it (0/14 hits: the op in flight at a free was a
                           forward on the compute stream, where the next owner's writes queue
                           anyway); free-reuse, built from that ledger, frees donors' snapshot slots
                           under their pending clones and hands them to newcomers at once (one
                           wave per fresh engine: the slot layout it relies on)

The quick matrix (``--quick``) runs each cell for its ``quick`` request count: the embedded engine
is a function of its seeds, so at the default seed 0 those counts are what each cell needs to show
its fault (admission_barrier=off first fails at request 9, evict_locked=on at 14, free_unfenced=on
at 17), with a margin.
Another seed may need more: the timed matrix (``--budget``) is the measurement.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hammer.runs import EMBEDDED, execute
from hammer.soak import SoakPlan

__all__ = ["CELLS", "CLEAN", "Cell", "run_matrix"]

CLEAN = "clean"
ALL_PATTERNS = ("alternate-abandon", "saturate", "follow-up", "branch-fanout", "chunk-boundary", "multi-turn",
                "media-ab", "donate-hit", "free-reuse")


@dataclass(frozen=True)
class Cell:
    name: str
    faults: tuple[str, ...]
    patterns: tuple[str, ...]
    expected: str | None  # the attribution verdict its corrupted hits must get (None: the clean cell)
    engine: Mapping[str, Any] = field(default_factory=dict)
    settings: tuple[tuple[str, Any], ...] = ()  # pattern settings (as --set KEY=VALUE)
    round_size: int = 8  # small rounds: every round is a fresh engine with the next device seed
    quick: int = 16  # hammer requests in the quick matrix (--quick; enough at seed 0, see the docstring)
    extra: bool = False  # a fault outside the catalogue: run only when named (--faults)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "faults": list(self.faults), "patterns": list(self.patterns),
                "expected": self.expected, "engine": dict(self.engine), "settings": dict(self.settings),
                "round_size": self.round_size, "quick": self.quick, "extra": self.extra}


_OVERLAP = {"overlap": True}
_PRESSURE = {"max_running": 2, "num_slots": 6}
CELLS: dict[str, Cell] = {cell.name: cell for cell in (
    Cell("donate=transfer", ("donate=transfer",), ("follow-up",), "poisoned-after-donate",
         {"overlap": True, "page_size": 1, "num_pages": 8192}),
    Cell("admission_barrier=off", ("admission_barrier=off",), ("donate-hit",), "restore-raced", {"max_running": 16},
         settings=(("hits", 1), ("max_tokens", 2), ("prefix_tokens", 70), ("prefixes", 8), ("repeat", True)),
         round_size=16, quick=32),
    Cell("track_writer=off", ("track_writer=off",), ("alternate-abandon",), "bad-at-donate"),
    Cell("metadata_fence=off", ("metadata_fence=off",), ("media-ab",), "stale-metadata"),
    Cell("page_cow=off", ("page_cow=off",), ("branch-fanout",), "cow-violation",
         settings=(("sampled", 1.0), ("temperature", 4.0))),
    Cell("evict_locked=on", ("evict_locked=on",), ("donate-hit",), "evicted-under-lock", _PRESSURE,
         settings=(("hits", 0),), round_size=6, quick=18),
    Cell("media_key=off", ("media_key=off",), ("media-ab",), "key-or-payload"),
    Cell(CLEAN, (), ALL_PATTERNS, None, _OVERLAP, round_size=4, quick=36),
    # outside the catalogue (see the docstring)
    Cell("restore_rec=off", ("restore_rec=off",), ALL_PATTERNS, "restore-incomplete", round_size=4, quick=36,
         extra=True),
    Cell("free_unfenced=on", ("free_unfenced=on",), ("free-reuse",), "freed-in-flight", round_size=22, quick=44,
         extra=True),
)}


def select(names: Iterable[str] | None) -> list[Cell]:
    """The cells named (when None: the catalogue and clean, not the extras); ValueError naming the unknown ones."""
    if not names:
        return [cell for cell in CELLS.values() if not cell.extra]
    unknown = [n for n in names if n not in CELLS]
    if unknown:
        raise ValueError(f"unknown matrix cell(s) {', '.join(unknown)}; known: {', '.join(CELLS)}")
    return [CELLS[n] for n in names]


def run_matrix(cells: Iterable[Cell], out: str | Path, *, seed: int = 0, budget: float | None = None,
               requests: int | None = None, quick: bool = False, model: str | None = None,
               device: str | None = None, device_seed: int | None = None, dtype: str | None = None,
               echo: Callable[[str], None] = print) -> Path:
    """Run each cell into ``out``/<cell>/, bounded by ``budget`` seconds, by ``requests`` hammer
    requests, or (``quick``) by the cell's own quick count, with the engine's ``model`` (None: its default) on
    its ``device`` (None: the sim) under ``device_seed`` (None: the engine's default; on cuda a nonzero seed
    adds the stream-delay nemesis, ``mini_engine.device.cuda``) with ``dtype`` projections (None: the engine's
    float32); returns the path of ``out``/matrix.json."""
    if sum((budget is not None, requests is not None, quick)) != 1:
        raise ValueError("bound the cells one way: a time budget, a request count, or quick")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"seed": seed, "budget_s": budget, "requests": requests, "quick": quick, "model": model,
                              "device": device or "sim", "device_seed": device_seed, "dtype": dtype or "float32",
                              "cells": []}
    path = out / "matrix.json"
    for cell in cells:
        plan = SoakPlan(cell.patterns, seed, round_size=cell.round_size, requests=cell.quick if quick else requests,
                        duration=budget, settings=cell.settings)
        started = time.monotonic()
        engine = {**cell.engine, "faults": cell.faults, **({"model": model} if model else {}),
                  **({"device": device} if device else {}),
                  **({"device_seed": device_seed} if device_seed is not None else {}),
                  **({"dtype": dtype} if dtype else {})}
        run_dir, code, _ = execute(target=EMBEDDED, plan=plan, out=out / _folder(cell.name), engine=engine,
                                   command=("hammer", "faults", "--faults", cell.name), echo=lambda _line: None)
        seconds = time.monotonic() - started
        record["cells"].append({**cell.as_dict(), "run": str(run_dir), "exit_code": code, "seconds": round(seconds, 2)})
        path.write_text(json.dumps(record, indent=2) + "\n")  # after every cell: a killed matrix keeps its cells
        echo(f"  {cell.name}: {seconds:.1f} s -> {run_dir}")
    return path


def _folder(name: str) -> str:
    return name.replace("=", "-")
