"""How often a fault's mechanism fires, read from the slot ledger: exact on any device, so it reports
the ``donate=transfer`` and ``metadata_fence=off`` cells on a GPU, where the logits are not
bit-exact and the reference oracle cannot count (``EngineConfig.bit_exact``).

Runs the fault matrix's cells (their own patterns and engine options, ``--requests`` hammer requests
each) on ``--device`` and counts, per cell, over the hammer and control engines:

- restores whose source bytes (the checksum the copy read) differ from the bytes last written into
  that slot at that position before it (the clone, the snapshot write or the donor's own write):
  a donated state changed after donation -- the aliasing of ``donate=transfer``; a restore either of whose
  digests reads 0 never had them land (``forensics.attribute.UNLANDED``: the ledger's failure, not the
  engine's) and is counted apart, as unlanded, not as changed;
- decode steps whose page table as the kernel read it differs from the one staged for it: the stale
  resident metadata of ``metadata_fence=off``.

On cuda, ``--device-seeds 0 1 2`` runs the matrix once per seed: 0 leaves the GPU its own timing,
any other seed adds the stream-delay nemesis (``mini_engine.device.cuda``), which moves only *when*
each stream reaches its ops, so an unfenced pair of ops on two streams meets in either order.
``--model qwen3.5-0.8b-shaped-random --dtype bfloat16`` runs the cells at a production model's size,
whose donation clones copy 19 MB a slot on the copy stream (the tiny model's: 0.1 MB), so an
unfenced upload queued behind them lands later on the GPU's own timing.

The ``donate=transfer`` cell needs replies that end on a stop (the scheduler cannot foresee one, so the next
decode is in flight at the donation): its ``follow-up`` turns stop at U+FFFD, which the tiny random model emits
within a few bytes. The random 0.8B model's greedy replies repeat the prompt's last character (``:`` after the
probes' "Answer:") and never stop, so there every reply ends by length and nothing aliases (0 of 21 on the sim and
on the GPU, session 13); ``--reply-stop :`` adds a stop that model emits (18 of 21 on the GPU, session 14).

Usage: ``python benchmarks/fault_mechanisms.py [--device sim|cuda] [--requests 60] [--device-seeds 0 1]
[--model NAME] [--dtype float32|bfloat16] [--cells NAME ...] [--reply-stop TEXT] [--out FILE]``. ``--reply-stop``
reaches the cells whose patterns are ``follow-up`` alone (a plan's settings go to every pattern of it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from forensics.attribute import donated_states, unlanded
from hammer.matrix import run_matrix, select
from hammer.patterns.follow_up import REPLY_STOP

CELLS = ("donate=transfer", "metadata_fence=off", "clean")


def mechanism_counts(ledger: Path) -> dict[str, int]:
    groups: dict[tuple, list[dict]] = defaultdict(list)  # one ledger per engine (hammer / control, round)
    with ledger.open() as handle:
        for line in handle:
            row = json.loads(line)
            groups[(row.get("engine"), row.get("round"))].append(row)
    counts = {"restores": 0, "restores_changed_after_donation": 0, "restores_unlanded": 0, "decode_steps": 0,
              "decode_steps_stale": 0}
    for rows in groups.values():
        for read, donated in donated_states(rows):
            counts["restores"] += 1
            if unlanded(row for row in (read, donated) if row is not None):
                counts["restores_unlanded"] += 1
            elif donated is not None and donated["checksum"] != read["src_checksum"]:
                counts["restores_changed_after_donation"] += 1
        decodes = [row for row in rows if row["type"] == "decode_metadata"]
        counts["decode_steps"] += len(decodes)
        counts["decode_steps_stale"] += sum(not row["match"] for row in decodes)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("sim", "cuda"), default="sim")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--device-seeds", type=int, nargs="+", default=[0],
                        help="one matrix per seed (on cuda, 0: the GPU's own timing; others: the stream-delay nemesis)")
    parser.add_argument("--model", default=None, help="the engine's model (default: the engine's, probe-tiny)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    parser.add_argument("--cells", nargs="+", choices=CELLS, default=list(CELLS), help="the cells to run")
    parser.add_argument("--reply-stop", action="append", default=[], metavar="TEXT",
                        help="also stop the follow-up pattern's replies at TEXT (repeatable; the donate=transfer cell: "
                             "a model whose replies never reach U+FFFD)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    # a plan's settings go to every pattern of it, and only follow-up takes a stop: the cells of follow-up alone
    # (donate=transfer's; the clean cell's other patterns would refuse it)
    cells = [dataclasses.replace(cell, settings=(*cell.settings, ("stop", (*REPLY_STOP, *args.reply_stop))))
             if args.reply_stop and set(cell.patterns) == {"follow-up"} else cell for cell in select(args.cells)]
    rows = []
    for device_seed in args.device_seeds:
        with tempfile.TemporaryDirectory() as folder:
            matrix = json.loads(run_matrix(cells, folder, requests=args.requests, model=args.model,
                                           device=args.device, device_seed=device_seed, dtype=args.dtype,
                                           echo=lambda _line: None).read_text())
            rows += [{"cell": cell["name"], "device_seed": device_seed, "seconds": cell["seconds"],
                      "exit_code": cell["exit_code"], **mechanism_counts(Path(cell["run"]) / "ledger.jsonl")}
                     for cell in matrix["cells"]]
    print(f"device {args.device}, model {args.model or 'default'} ({args.dtype or 'float32'}), {args.requests} "
          f"hammer requests per cell (and their controls); hammer exit 1 = corruption found")
    print(f"{'cell':<20}{'seed':>5}{'restores':>9}{'changed after donation':>24}{'unlanded':>10}{'decode steps':>14}"
          f"{'stale metadata':>16}{'exit':>6}")
    for r in rows:
        print(f"{r['cell']:<20}{r['device_seed']:>5}{r['restores']:>9}{r['restores_changed_after_donation']:>24}"
              f"{r['restores_unlanded']:>10}{r['decode_steps']:>14}{r['decode_steps_stale']:>16}{r['exit_code']:>6}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": args.device, "model": args.model, "dtype": args.dtype, "requests": args.requests,
                       "reply_stop": args.reply_stop, "cells": rows}, f, indent=2)


if __name__ == "__main__":
    main()
