"""The post-mortem of one run: what failed, which cause the ledger proves, and the story behind it.

Built from a run directory's ``attribution.json`` (``hammer analyze`` writes it), its ledger and
its history; pure, nothing here runs a model. ``build`` returns the structure (what the reports
read, written as ``postmortem.json``), ``render`` the text::

    header          run, target, faults, seeds, counts, and the ledger's state digests that read 0 (never
                    landed: the engine's instrumentation failed, ``attribute.UNLANDED``; attribution.json's
                    ``ledger_unlanded``) if there are any
    verdicts        one row per corrupted request: verdict, sticky window, oracles that fired, and on an
                    HTTP run the id the server knows it by (what to look for in the server's own logs)
    parted          per corrupted request with a cold control: where its live state (or, with every state
                    equal, its logits) first parted from the control's (``forensics.divergence``, in
                    attribution.json): what the attribution's "state-clean, look elsewhere" points at
    hypotheses      each cause confirmed / falsified / untested, with the count that says so
    windows         per sticky window (a donation, until the same prefix is donated again): the
                    donation, every write to its slot, every restore from it and whether that
                    hit came out corrupted
    slots           the life story of each slot a verdict names: every ledger row touching it,
                    from the allocation before the donation to the failing restore
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from forensics.attribute import unlanded_note
from forensics.divergence import Divergence
from forensics.ledger import streams
from forensics.records import RequestRecord, fold_history
from forensics.rundir import RunDir

__all__ = ["build", "describe_row", "render", "write_postmortem"]

Row = Mapping[str, Any]
_CONTEXT = ("engine", "round", "type", "seq", "step")
_SLOT_FIELDS = ("slot", "src", "dst")
_WINDOW_TYPES = ("slot_write", "snapshot_write", "clone_written", "restore", "restore_read", "alloc", "free",
                 "evict", "transfer", "donate")


def describe_row(row: Row) -> str:
    """One ledger row as text: ``seq 33 step 3 donate rid=a slot=1 ...`` (checksums in hex)."""
    fields = []
    for key, value in row.items():
        if key in _CONTEXT:
            continue
        if "checksum" in key and isinstance(value, int):
            value = f"{value:016x}"
        fields.append(f"{key}={value}")
    return f"seq {row.get('seq', '?'):>5} step {row.get('step', '?'):>4}  {row['type']:<16} {' '.join(fields)}"


def build(run_dir: str | Path, *, fired: Mapping[str, Sequence[str]] | None = None, max_rows: int = 60) -> dict:
    """The post-mortem structure of ``run_dir``; ``fired``: request -> the oracles that fired on it.

    Raises FileNotFoundError when the run has not been analysed (no attribution.json)."""
    run_dir = Path(run_dir)
    run = RunDir.open(run_dir)
    attribution = json.loads((run_dir / "attribution.json").read_text())
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    records = fold_history(run.history()).records
    by_stream = streams(run.ledger())
    fired = fired or {}
    corrupted = {v["request"] for v in attribution["verdicts"]}
    verdicts = [{"request": v["request"], "verdict": v["verdict"], "window": v.get("window"),
                 "hit": records[v["request"]].hit if v["request"] in records else None,
                 "server_id": _server_id(records.get(v["request"]), run.meta.target),
                 "fired": list(fired.get(v["request"], ())), "note": _note(v), "evidence": v["evidence"]}
                for v in attribution["verdicts"]]
    parted = {p["rid"]: p for p in attribution.get("parted", ())}
    for v in verdicts:
        v["parted"] = parted.get(v["request"])
    windows, slots = [], {}
    for window in attribution.get("windows", ()):
        donation = _donation_of(window["window"], attribution["verdicts"])
        if donation is None:
            continue
        rows = by_stream.get((donation.get("engine"), donation.get("round")), [])
        windows.append(_window(window, donation, rows, corrupted))
        for verdict in attribution["verdicts"]:
            if verdict.get("window") == window["window"]:
                for key, story in _stories(verdict, donation, rows, max_rows).items():
                    # one story per allocation of a slot, told up to the latest failure that names it
                    if key not in slots or _length(story) > _length(slots[key]):
                        slots[key] = story
    return {"run": str(run_dir.resolve()), "target": dict(run.meta.target), "faults": list(run.meta.faults),
            "seeds": dict(run.meta.seeds), "counts": summary.get("counts", {}),
            "unlanded": attribution.get("ledger_unlanded", 0),
            "verdicts": verdicts,
            "hypotheses": attribution["hypotheses"], "windows": windows, "slots": list(slots.values())}


def _length(story: Mapping[str, Any]) -> int:
    return len(story["rows"]) + story["more"]


def _server_id(record: RequestRecord | None, target: Mapping[str, Any]) -> str | None:
    """The id a server filed ``record``'s request under (``RequestRecord.server_ids``' most specific); a later choice
    with no echo of its own: its request's ``X-Request-Id`` and the choice. None on an embedded run."""
    if record is None or target.get("kind") == "embedded":
        return None
    prefix = target.get("request_ids")
    ids = record.server_ids(prefix)
    if ids or not prefix:
        return ids[0] if ids else None
    return f"{prefix}-{record.parent} (choice {record.choice})"


def _note(verdict: Mapping[str, Any]) -> str:
    """What the evidence adds to the verdict: a donor that was itself a corrupted hit passed its poison on."""
    donor = verdict.get("inherited")
    return f"donor {donor} was itself corrupted: the poison passed on" if donor else ""


def _donation_of(window: str, verdicts: Iterable[Mapping[str, Any]]) -> Row | None:
    """The donate row a window (``prefix@seq``) names, from the evidence of a verdict in it."""
    for verdict in verdicts:
        if verdict.get("window") == window:
            for row in verdict["evidence"]:
                if row["type"] == "donate" and f"{row.get('prefix')}@{row['seq']}" == window:
                    return row
    return None


def _window(window: Mapping[str, Any], donation: Row, rows: Sequence[Row], corrupted: set[str]) -> dict:
    """The donation, then what touched its slot until the prefix is donated again."""
    slot, start = donation["slot"], donation["seq"]
    ordered = sorted(rows, key=lambda r: r.get("seq", 0))
    end = next((r["seq"] for r in ordered if r["type"] == "donate" and r["seq"] > start
                and r.get("prefix") == donation.get("prefix")), None)
    timeline, restores, bad = [], 0, 0
    for row in ordered:
        if row["seq"] < start or (end is not None and row["seq"] >= end) or row["type"] not in _WINDOW_TYPES:
            continue
        if row is not donation and not any(row.get(k) == slot for k in _SLOT_FIELDS):
            continue
        note = ""
        if row["type"] == "restore_read":
            restores += 1
            wrong = row.get("rid") in corrupted
            bad += wrong
            note = "CORRUPTED hit" if wrong else "hit ok"
        timeline.append({"row": dict(row), "note": note})
    return {"window": window["window"], "prefix": donation.get("prefix"), "slot": slot,
            "stream": [donation.get("engine"), donation.get("round")], "restores": restores, "corrupted": bad,
            "ended_by": "re-donation" if end is not None else "end of run", "timeline": timeline}


def _stories(verdict: Mapping[str, Any], donation: Row, rows: Sequence[Row], max_rows: int) -> dict[tuple, dict]:
    """Life stories of the slots a verdict names: the donated slot and the restore's source and target."""
    ordered = sorted(rows, key=lambda r: r.get("seq", 0))
    reads = [r for r in verdict["evidence"] if r["type"] == "restore_read"]
    last = max((r["seq"] for r in verdict["evidence"]), default=donation["seq"])
    named = {donation["slot"], *(r[k] for r in reads for k in ("src", "dst") if k in r)}
    stream = (donation.get("engine"), donation.get("round"))
    out = {}
    for slot in sorted(named):
        # the donated slot's story starts where it was allocated for the donor; a restore target's
        # where it was allocated for the failing request
        since = donation["seq"] if slot == donation["slot"] else last
        allocs = [r["seq"] for r in ordered if r["type"] == "alloc" and r.get("slot") == slot and r["seq"] <= since]
        first = allocs[-1] if allocs else 0
        touching = [dict(r) for r in ordered if first <= r.get("seq", 0) <= last
                    and any(r.get(k) == slot for k in _SLOT_FIELDS)]
        out[(stream, slot, first)] = {"slot": slot, "stream": list(stream), "request": verdict["request"],
                                      "rows": touching[:max_rows],
                               "more": max(0, len(touching) - max_rows)}
    return out


def render(pm: Mapping[str, Any]) -> str:
    """The post-mortem as text (see the module docstring for its sections)."""
    counts = pm["counts"]
    lines = [f"post-mortem of {pm['run']}",
             f"target {pm['target'].get('kind', '?')} {pm['target'].get('url', '')}".rstrip()
             + f"; faults {', '.join(pm['faults']) or 'none'}; seeds "
             + ", ".join(f"{k} {v}" for k, v in pm["seeds"].items()),
             "counts " + (", ".join(f"{k} {counts[k]}" for k in ("requests", "hits", "corrupted", "corrupted_hits")
                                    if k in counts) or "not judged")]
    if pm.get("unlanded"):
        lines.append(f"LEDGER: {unlanded_note(pm['unlanded'])}")
    lines.append("")
    verdicts = pm["verdicts"]
    tally: dict[str, int] = {}
    for v in verdicts:
        tally[v["verdict"]] = tally.get(v["verdict"], 0) + 1
    lines.append(f"VERDICTS: {len(verdicts)} corrupted request(s)"
                 + (": " + ", ".join(f"{k} {n}" for k, n in sorted(tally.items(), key=lambda kv: -kv[1]))
                    if verdicts else " -- nothing to attribute"))
    server = any(v.get("server_id") for v in verdicts)
    header = ["request", *(["server id"] if server else []), "hit", "verdict", "window", "oracles fired", "note"]
    lines += _table(header,
                    [[v["request"], *([v.get("server_id") or "-"] if server else []),
                      {True: "hit", False: "cold", None: "?"}[v["hit"]], v["verdict"], v["window"] or "-",
                      ", ".join(v["fired"]) or "-", v["note"]] for v in verdicts])
    parted = [v["parted"] for v in verdicts if v.get("parted")]
    if parted:
        lines += ["", "AGAINST THE COLD CONTROLS (the first difference of each one's ledger and its control's, if any)"]
        lines += [f"  {Divergence.from_dict(p).describe()} [control {p['control']}]" for p in parted]
    lines += ["", "HYPOTHESES"]
    lines += _table(["hypothesis", "status", "evidence", "cause"],
                    [[h["hypothesis"], h["status"], h["detail"], h["description"]] for h in pm["hypotheses"]])
    for w in pm["windows"]:
        lines += ["", f"WINDOW {w['window']}: prefix {w['prefix']} donated into slot {w['slot']} "
                      f"(stream {w['stream'][0]} round {w['stream'][1]}); {w['restores']} restore(s), "
                      f"{w['corrupted']} corrupted; ends at {w['ended_by']}"]
        lines += [f"  {describe_row(item['row'])}" + (f"   <- {item['note']}" if item["note"] else "")
                  for item in w["timeline"]]
    for story in pm["slots"]:
        lines += ["", f"SLOT {story['slot']} (stream {story['stream'][0]} round {story['stream'][1]}), as "
                      f"{story['request']} found it: from its allocation to the failing restore"]
        lines += [f"  {describe_row(row)}" for row in story["rows"]]
        if story["more"]:
            lines.append(f"  ... {story['more']} more row(s) in ledger.jsonl")
    return "\n".join(lines) + "\n"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    if not rows:
        return []
    cells = [list(map(str, header)), *[list(map(str, r)) for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return [fmt(cells[0]), fmt(["-" * w for w in widths]), *map(fmt, cells[1:])]


def write_postmortem(run_dir: str | Path, *, fired: Mapping[str, Sequence[str]] | None = None,
                     max_rows: int = 60) -> tuple[str, dict]:
    """Write ``postmortem.txt`` and ``postmortem.json`` into the run directory; returns (text, structure)."""
    pm = build(run_dir, fired=fired, max_rows=max_rows)
    text = render(pm)
    (Path(run_dir) / "postmortem.txt").write_text(text)
    (Path(run_dir) / "postmortem.json").write_text(json.dumps(pm, indent=1, default=str) + "\n")
    return text, pm
