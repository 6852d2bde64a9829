"""A server's slot ledger, attached to an HTTP run: what ``hammer analyze --ledger-log`` does.

An embedded run writes its engine's ledger as it goes. A server writes its own, into its log
(``LEDGER <type> key=value ...`` lines, the public schema's adapter: ``forensics.ledger``) or as JSON
rows, under *its* request ids. A row's ``rid`` names a run's request when it is

- the ``X-Request-Id`` the run sent with it (``<request_ids>-<request>``, the prefix in meta.target),
  or that id behind a server's own prefix (vLLM's ``cmpl-<id>``, ``chatcmpl-<id>``, ``1_chatcmpl-<id>``):
  this names every request the run sent, abandoned ones included;
- the id the response carried (the ok event's ``server_id``);
- the ``request_id`` the server echoed (the ``forensics`` extension: mini-engine's, per choice).

Attaching renames the rows to the run's requests, puts the hammer server's in the ``hammer`` stream and the
control server's in ``control``, and writes the run directory's ``ledger.jsonl``; attribution and the
comparison with the cold controls then read it as they read an embedded run's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from forensics import RequestRecord, RunDir, choice_request_id, fold_history, read_jsonl
from forensics.ledger import LedgerWriter, adopt_rows, parse_log_lines
from hammer.patterns import CONTROL_ARM, HAMMER_ARM

__all__ = ["attach_ledger_logs"]


def attach_ledger_logs(run_dir: str | Path, hammer_log: str | Path, control_log: str | Path | None = None
                       ) -> dict[str, int]:
    """Write ``run_dir``'s ledger from the hammer server's ledger (and the control server's); returns the rows
    adopted per stream and how many requests of each lane the ledger names.

    Raises ValueError for an embedded run, a run that already has a ledger, a run whose server echoed no request
    ids, or a ledger that names none of the run's requests; SchemaError for a bad row (naming its line)."""
    run = RunDir.open(run_dir)
    if run.meta.target.get("kind") == "embedded":
        raise ValueError(f"{run_dir} is an embedded run: its engine wrote its ledger itself")
    if run.ledger_path.exists():
        raise ValueError(f"{run_dir} already has a ledger ({run.ledger_path.name}); attach to a run without one")
    prefix = run.meta.target.get("request_ids")
    ids = _server_ids(fold_history(run.history()).records.values(), prefix)
    if not any(ids.values()):
        raise ValueError(f"{run_dir}: the run sent no request ids (a run from before they were sent) and the server "
                         "echoed none (forensics.request_id, the response id), so its ledger cannot be matched to the "
                         "run's requests")
    lanes = [("hammer", hammer_log, ids[HAMMER_ARM])] + ([("control", control_log, ids[CONTROL_ARM])]
                                                          if control_log is not None else [])
    rows, counts = [], {}
    for engine, path, lane_ids in lanes:
        read = _read(Path(path))
        adopted = adopt_rows(read, _renames(read, lane_ids, prefix), engine=engine)
        named = {row["rid"] for row in adopted if row.get("rid") in lane_ids.values()}
        if not named:
            raise ValueError(f"{path}: no ledger row names a request this run sent to the {engine} server "
                             f"(ids such as {', '.join(sorted(lane_ids)[:3]) or 'none'})")
        rows += adopted
        counts[engine], counts[f"{engine}_requests"] = len(adopted), len(named)
    ledger = LedgerWriter(run.ledger_path)
    try:
        for row in rows:
            ledger.write(row)
    finally:
        ledger.close()
    return counts


def _server_ids(records: Iterable[RequestRecord], prefix: str | None) -> dict[str, dict[str, str]]:
    """Per arm: every id a server may have filed a request's rows under -> the run's request."""
    ids: dict[str, dict[str, str]] = {HAMMER_ARM: {}, CONTROL_ARM: {}}
    for record in records:
        ids[record.arm].update(dict.fromkeys(record.server_ids(prefix), record.request))
    return ids


def _renames(rows: Iterable[Mapping[str, Any]], ids: Mapping[str, str], prefix: str | None) -> dict[str, str]:
    """Server id -> run request for every ``rid`` of ``rows`` that names one of the run's requests."""
    renames = {}
    for rid in {row.get("rid") for row in rows}:
        if isinstance(rid, str) and (request := ids.get(rid) or _sent_within(rid, ids, prefix)) is not None:
            renames[rid] = request
    return renames


def _sent_within(rid: str, ids: Mapping[str, str], prefix: str | None) -> str | None:
    """The run's request whose sent ``X-Request-Id`` ``rid`` holds between a server's own decorations: a prefix
    (``cmpl-<id>``), a random suffix (vLLM since late 2025: ``cmpl-<id>-1a2b3c4d``), a choice (vLLM's ``1_cmpl-<id>``,
    mini-engine's ``cmpl-<id>#1``). The longest sent id that ends at a boundary wins."""
    at = rid.find(f"{prefix}-") if prefix else -1
    if at < 0 or (at > 0 and rid[at - 1] not in "-_"):
        return None
    tail = rid[at:]
    for end in [len(tail), *sorted((i for i, c in enumerate(tail) if c in "-_#"), reverse=True)]:
        if tail[:end] not in ids:
            continue
        if ours := re.match(r"#(\d+)", tail[end:]):
            choice = int(ours[1])
        elif vllms := re.match(r"(\d+)_", rid[:at]):
            choice = int(vllms[1])
        else:
            choice = 0
        return choice_request_id(ids[tail[:end]], choice)
    return None


def _read(path: Path) -> list[dict[str, Any]]:
    """A ledger's rows: JSON lines (``*.jsonl``) or a log whose ``LEDGER`` lines are rows (anything else)."""
    if path.suffix == ".jsonl":
        return [{"seq": number, **row} for number, row in enumerate(read_jsonl(path), 1)]
    with path.open(encoding="utf-8", errors="replace") as handle:
        return parse_log_lines(handle)
