"""The slot ledger (version ``LEDGER_VERSION``): a public schema of slot events any engine can emit.

A row is a flat JSON object with ``type``, ``seq`` (its order in its stream; device-side rows are
emitted when the op *runs*) and the fields below; ``step``, ``engine`` / ``round`` (which engine
stream of a run it belongs to), ``stream`` and ``batch`` are optional everywhere. Checksums are
64-bit integers over a slot's exact bytes (``mini_engine.ops.checksum`` documents the function; a
foreign engine may use any 64-bit digest as long as it uses one throughout). A state checksum of 0 says the
digest never landed (``attribute.UNLANDED``): it is not evidence, and a verdict resting on it is ``ledger-unlanded``.

    type               required fields                         says
    alloc / free       slot, owner, role                       a slot changed hands
    snapshot_track     rid, slot, position                     a forward was asked to write a snapshot
    snapshot_write     rid, slot, position, checksum           ... and wrote it (device)
    slot_write         rid, slot, position, checksum           a forward wrote a live slot (device)
    clone_written      src, dst, position, checksum            a donation clone landed (device)
    donate             rid, slot, position, prefix, policy     the tree took a snapshot (copy / transfer)
    restore            rid, src, dst, position, prefix         a hit will restore (host)
    restore_read       rid, src, dst, position, src_checksum   the restore read its source (device)
    decode_metadata    rid, read_checksum, staged_checksum     the page table a decode kernel read
    reference_state    prefix, position, checksum              the state a prefix should have (cold)
    shared_page_write  rid, page                               a page held by others written in place
    fault              name                                    a safeguard the engine had switched off
    checksum_format    state                                   how this engine's state checksums read a slot

A ``checksum_format`` row names what an engine's state checksums cover and how (any text, one per engine build):
two ledgers' live-slot checksums are compared only where their formats are the same (``checksum_format``).

Other types (``evict``, ``fork``, ``page_cow``, ``metadata_upload``, ``metadata_readback``,
``clone``, ``transfer``, ``abort``) are accepted with any fields. ``parse_log_lines`` is the
adapter for engines that log rather than write JSON: every line holding ``LEDGER <type>
key=value ...`` becomes a row (values: decimal or ``0x`` integers, ``true``/``false``, or text;
``rid``, ``owner``, ``role``, ``prefix``, ``policy``, ``name``, ``state`` are always text);
everything else on the line and every other line is ignored, so a whole server log can be fed.
``log_line`` writes that form: an engine logs ``log_line(row)`` and the adapter reads the row back.
"""

from __future__ import annotations

import json
import os
import shlex
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from forensics.attribute import Attribution, attribute, inherited_detail
from forensics.schema import SchemaError

__all__ = ["LEDGER_VERSION", "ROW_FIELDS", "LedgerWriter", "adopt_rows", "attribute_streams", "checksum_format",
           "log_line", "parse_log_lines", "streams", "validate_row"]

LEDGER_VERSION = 1

ROW_FIELDS: dict[str, tuple[str, ...]] = {
    "alloc": ("slot", "owner", "role"),
    "free": ("slot", "owner", "role"),
    "snapshot_track": ("rid", "slot", "position"),
    "snapshot_write": ("rid", "slot", "position", "checksum"),
    "slot_write": ("rid", "slot", "position", "checksum"),
    "clone_written": ("src", "dst", "position", "checksum"),
    "donate": ("rid", "slot", "position", "prefix", "policy"),
    "restore": ("rid", "src", "dst", "position", "prefix"),
    "restore_read": ("rid", "src", "dst", "position", "src_checksum"),
    "decode_metadata": ("rid", "read_checksum", "staged_checksum"),
    "reference_state": ("prefix", "position", "checksum"),
    "shared_page_write": ("rid", "page"),
    "fault": ("name",),
    "checksum_format": ("state",),
}
_TEXT_FIELDS = ("rid", "owner", "role", "prefix", "policy", "name", "engine", "label", "state")  # never parsed as numbers
_FREE_FORM = ("evict", "fork", "page_cow", "metadata_upload", "metadata_readback", "clone", "transfer", "abort")


class LedgerWriter:
    """A run's ``ledger.jsonl``: one row a line, as the engine (or an adopted server ledger) gives it, appended.

    The embedded target flushes once per engine step (``flush``), not per row: a killed run loses at most the
    rows of the step it was in.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self._file = open(Path(path), "a", encoding="utf-8")  # noqa: SIM115 -- open until close()

    def write(self, row: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(row, separators=(",", ":"), default=str) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def validate_row(row: Mapping[str, Any]) -> None:
    """Raise SchemaError naming the row's type and the missing field; pure."""
    kind = row.get("type")
    if kind not in ROW_FIELDS and kind not in _FREE_FORM:
        raise SchemaError(f"ledger row type {kind!r} is unknown; known: {', '.join([*ROW_FIELDS, *_FREE_FORM])}")
    if not isinstance(row.get("seq"), int):
        raise SchemaError(f"ledger row {kind!r} needs an integer 'seq' (its order in its stream)")
    missing = [f for f in ROW_FIELDS.get(kind, ()) if f not in row]
    if missing:
        raise SchemaError(f"ledger row {kind!r} (seq {row['seq']}) lacks {', '.join(missing)}")


def checksum_format(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The state checksum format a ledger's ``checksum_format`` rows name (several: joined by " + "); None: none."""
    named = sorted({str(row["state"]) for row in rows if row.get("type") == "checksum_format"})
    return " + ".join(named) or None


def streams(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, Any], list[Mapping[str, Any]]]:
    """Rows grouped by the engine stream they came from (``engine``, ``round``); seq restarts per stream."""
    grouped: dict[tuple[Any, Any], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[(row.get("engine"), row.get("round"))].append(row)
    return dict(grouped)


def attribute_streams(rows: Iterable[Mapping[str, Any]], corrupted: Sequence[str], *,
                      echo_failed: Iterable[str] = ()) -> Attribution:
    """Attribute each corrupted request within the stream that served it (the one whose rows name it);
    a request no stream names is judged against an empty ledger (every hypothesis untested for it)."""
    rows = list(rows)
    if not corrupted:
        return attribute(rows, [])
    by_stream = streams(rows)
    echo, home = set(echo_failed), {}
    for key, stream in by_stream.items():
        for row in stream:
            if row.get("rid") in corrupted and key[0] != "control":
                home.setdefault(row["rid"], key)
    parts = [attribute(by_stream.get(home.get(rid), ()), [rid], echo_failed=echo & {rid}, known_bad=corrupted)
             for rid in corrupted]
    return Attribution(tuple(v for part in parts for v in part.verdicts), _merge_hypotheses(parts),
                       _merge_windows(parts))


def _merge_windows(parts: Sequence[Attribution]) -> tuple[dict[str, Any], ...]:
    """One row per sticky window, however many failures (attributed one by one) restored from it."""
    merged: dict[str, list[str]] = {}
    for part in parts:
        for window in part.windows:
            merged.setdefault(window["window"], []).extend(window["requests"])
    return tuple({"window": w, "failures": len(r), "requests": r} for w, r in merged.items())


def _merge_hypotheses(parts: Sequence[Attribution]) -> tuple[dict[str, Any], ...]:
    merged = []
    for i, first in enumerate(parts[0].hypotheses):
        statuses = [p.hypotheses[i]["status"] for p in parts]
        confirmed = statuses.count("confirmed")
        status = ("confirmed" if confirmed else "falsified" if "falsified" in statuses else "untested")
        tested = sum(s != "untested" for s in statuses)
        inherited = sum(v.verdict == first["hypothesis"] and v.inherited is not None for p in parts for v in p.verdicts)
        detail = (f"{confirmed} of {len(parts)} failures" if confirmed else
                  f"evidence clean on all {tested} failures that could test it" if tested else
                  inherited_detail(inherited) if inherited else "no failure could test it")
        merged.append({**first, "status": status, "detail": detail})
    return tuple(merged)


def parse_log_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Ledger rows from log lines holding ``LEDGER <type> key=value ...`` (others ignored). Rows without
    a ``seq`` are numbered in line order; each row is validated (SchemaError names the line)."""
    rows = []
    for number, line in enumerate(lines, 1):
        if "LEDGER " not in line:
            continue
        words = shlex.split(line[line.index("LEDGER ") + len("LEDGER "):])
        if not words:
            raise SchemaError(f"line {number}: 'LEDGER' must be followed by a row type")
        row: dict[str, Any] = {"type": words[0]}
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep:
                raise SchemaError(f"line {number}: {word!r} is not key=value")
            row[key] = value if key in _TEXT_FIELDS else _value(value)
        row.setdefault("seq", len(rows) + 1)
        try:
            validate_row(row)
        except SchemaError as err:
            raise SchemaError(f"line {number}: {err}") from None
        rows.append(row)
    return rows


def log_line(row: Mapping[str, Any]) -> str:
    """``row`` in the log form, ``LEDGER <type> key=value ...`` (checksums in hex, text quoted where it must be):
    what an engine that logs rather than writes JSON emits, and ``parse_log_lines`` reads back as the same row.
    SchemaError, naming the field, for what would not read back the same: None, a float, a list or a mapping, a
    boolean in a text field, text that does not print (a line break), or text in another field that would read
    back as a number or a boolean."""
    validate_row({"seq": 0, **row})  # the log form may leave seq out: line order numbers the rows
    words = ["LEDGER", str(row["type"])]
    for key, value in row.items():
        if key == "type":
            continue
        if not isinstance(key, str) or not key or "=" in key or key != shlex.quote(key):
            raise SchemaError(f"ledger row {row['type']!r}: field name {key!r} cannot be written as key=value")
        if isinstance(value, bool) and key not in _TEXT_FIELDS:
            text = "true" if value else "false"
        elif isinstance(value, int) and not isinstance(value, bool) and key not in _TEXT_FIELDS:
            text = f"{value:#x}" if key.endswith("checksum") else str(value)
        elif isinstance(value, str) and (key in _TEXT_FIELDS or _value(value) == value) and value.isprintable():
            text = shlex.quote(value)
        else:
            raise SchemaError(f"ledger row {row['type']!r}: {key}={value!r} would not read back from a log line "
                              f"(the log form carries integers, true/false and text; {key!r} is "
                              f"{'text' if key in _TEXT_FIELDS else 'not a text field'})")
        words.append(f"{key}={text}")
    return " ".join(words)


def adopt_rows(rows: Iterable[Mapping[str, Any]], ids: Mapping[str, str], *, engine: str) -> list[dict[str, Any]]:
    """A server's ledger rows as a run's own: every ``rid`` the run sent renamed from the server's request id to
    the run's (``ids``: server id -> run request, from the ids the server echoed), every row put in the stream
    ``engine`` (the run's lane: ``hammer`` or ``control``). Rows of requests the run did not send (another
    client's) keep their ids: they still touched the slots. Validates each row (SchemaError names it)."""
    adopted = []
    for row in rows:
        validate_row(row)
        rid = row.get("rid")
        adopted.append({**row, "engine": engine, **({"rid": ids[rid]} if rid in ids else {})})
    return adopted


def _value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text, 0)
    except ValueError:
        return text
