"""A server's slot ledger, attached to an HTTP run: what ``hammer analyze --ledger-log`` does.

An embedded run writes its engine's ledger as it goes. A server writes its own, into its log
(``LEDGER <type> key=value ...`` lines, the public schema's adapter: ``forensics.ledger``) or as JSON
rows, under *its* request ids; the run knows each request's server id from the ``request_id`` the
server echoed (the ``forensics`` extension: mini-engine's, or any server's that sends one). Attaching
renames the rows to the run's requests, puts the hammer server's in the ``hammer`` stream and the control
server's in ``control``, and writes the run directory's ``ledger.jsonl``; attribution and the comparison
with the cold controls then read it as they read an embedded run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forensics import RunDir, fold_history, read_jsonl
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
    ids: dict[str, dict[str, str]] = {HAMMER_ARM: {}, CONTROL_ARM: {}}
    for record in fold_history(run.history()).records.values():
        server_id = ((record.end or {}).get("forensic") or {}).get("request_id")
        if server_id is not None:
            ids[record.arm][str(server_id)] = record.request
    if not any(ids.values()):
        raise ValueError(f"{run_dir}: the server echoed no request ids (forensics.request_id), so its ledger "
                         "cannot be matched to the run's requests")
    lanes = [("hammer", hammer_log, ids[HAMMER_ARM])] + ([("control", control_log, ids[CONTROL_ARM])]
                                                          if control_log is not None else [])
    rows, counts = [], {}
    for engine, path, lane_ids in lanes:
        adopted = adopt_rows(_read(Path(path)), lane_ids, engine=engine)
        named = {row["rid"] for row in adopted if row.get("rid") in lane_ids.values()}
        if not named:
            raise ValueError(f"{path}: no ledger row names a request this run sent to the {engine} server "
                             f"(the server ids it echoed: {', '.join(sorted(lane_ids)[:3]) or 'none'}, ...)")
        rows += adopted
        counts[engine], counts[f"{engine}_requests"] = len(adopted), len(named)
    ledger = LedgerWriter(run.ledger_path)
    try:
        for row in rows:
            ledger.write(row)
    finally:
        ledger.close()
    return counts


def _read(path: Path) -> list[dict[str, Any]]:
    """A ledger's rows: JSON lines (``*.jsonl``) or a log whose ``LEDGER`` lines are rows (anything else)."""
    if path.suffix == ".jsonl":
        return [{"seq": number, **row} for number, row in enumerate(read_jsonl(path), 1)]
    with path.open(encoding="utf-8", errors="replace") as handle:
        return parse_log_lines(handle)
