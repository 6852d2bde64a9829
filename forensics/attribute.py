"""Attribution: for every corrupted hit, which cause the ledger proves (DESIGN.md §6).

Both seeds end with the first theory being wrong, so a verdict is a decision over data, never a
belief. For a corrupted request the decision list is::

    payload / cache key echoed wrong?                  -> key-or-payload
    no restore (a fork, or a cold request)?            -> skip the state path
    restored slot freed and reused since donation?     -> evicted-under-lock
    restore ran before the donation's clone landed?    -> restore-raced
    a digest the next checks compare reads 0?          -> ledger-unlanded (the engine's device digest never
                                                          landed: its instrumentation failed, the ledger
                                                          cannot judge this state path; ``UNLANDED``)
    restored slot != the bytes the restore read?       -> restore-incomplete (the copy itself dropped state)
    restored bytes != donated bytes?                   -> poisoned-after-donate (late write / alias)
    the clone read its source after the donor freed
      it, and not the bytes the donor's forward wrote? -> freed-in-flight (the next owner's write overtook
                                                          the clone: a free that forgot the op in flight)
    donated bytes != the prefix's cold reference?      -> bad-at-donate (writer bug; ``inherited``
                                                          when the donor was itself corrupted)
    a decode step read page mappings != staged?        -> stale-metadata
    a page shared with another request written?        -> cow-violation
    another request's decode read stale mappings
      before this one ended (wrote into its pages)?    -> stale-metadata
    otherwise                                          -> state-clean (the state path is clean: look elsewhere)

The ledger is the engine's instrumentation events in emission order (``seq``); device-side rows
(``slot_write``, ``snapshot_write``, ``clone_written``, ``restore_read``, ``decode_metadata``)
are emitted when the op runs, so their order is the order things happened on the device.
Every verdict carries the rows that prove it. Pure functions; nothing here runs a model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["HYPOTHESES", "STATE_DIGESTS", "UNLANDED", "Attribution", "Verdict", "attribute", "donated_states",
           "inherited_detail", "unlanded", "unlanded_note"]

Row = Mapping[str, Any]

# A state's 64-bit digest reads 0 with odds of 2**-64 (the empty state aside, which no slot holds): a ledger digest
# of 0 is one whose lane sums never landed (a device digest copied to the host before its kernel filled its rows,
# or rows zeroed under it), the engine's instrumentation failing, not evidence of what its slots held.
UNLANDED = 0
# the fields of each row type that hold a digest of a state's bytes
STATE_DIGESTS = {"slot_write": ("checksum",), "snapshot_write": ("checksum",), "reference_state": ("checksum",),
                 "clone_written": ("checksum", "src_checksum"), "restore_read": ("checksum", "src_checksum")}

# verdict -> the hypothesis it confirms (as the seeds named them)
HYPOTHESES = {
    "poisoned-after-donate": "aliasing / late write after donation",
    "bad-at-donate": "snapshot writer bug (bad at donation)",
    "restore-raced": "restore raced the donation (missing barrier)",
    "stale-metadata": "stale decode metadata",
    "cow-violation": "shared page written without copy-on-write",
    "evicted-under-lock": "snapshot evicted while locked",
    "restore-incomplete": "restore copied only part of the state",
    "freed-in-flight": "slot freed and handed on while a donation clone still had to read it",
    "key-or-payload": "client payload or cache key wrong",
}


@dataclass(frozen=True)
class Verdict:
    request: str
    verdict: str
    evidence: tuple[Row, ...]
    checked: tuple[str, ...]  # hypotheses whose evidence this request could test
    window: str | None = None  # the branch (prefix digest) and donation it restored from
    inherited: str | None = None  # bad-at-donate from a donor that was itself corrupted: that donor

    def as_dict(self) -> dict[str, Any]:
        return {"request": self.request, "verdict": self.verdict, "window": self.window,
                "inherited": self.inherited, "checked": list(self.checked),
                "evidence": [dict(r) for r in self.evidence]}


@dataclass(frozen=True)
class Attribution:
    verdicts: tuple[Verdict, ...]
    hypotheses: tuple[dict[str, Any], ...]
    windows: tuple[dict[str, Any], ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {"verdicts": [v.as_dict() for v in self.verdicts], "hypotheses": list(self.hypotheses),
                "windows": list(self.windows)}


class _Ledger:
    def __init__(self, rows: Iterable[Row]) -> None:
        self.rows = sorted(rows, key=lambda r: r.get("seq", 0))

    def find(self, type_: str, *, after: int = 0, before: float = float("inf"), **match) -> list[Row]:
        return [r for r in self.rows if r["type"] == type_ and after < r.get("seq", 0) < before
                and all(r.get(k) == v for k, v in match.items())]


def attribute(ledger: Iterable[Row], corrupted: Sequence[str], *, echo_failed: Iterable[str] = (),
              known_bad: Iterable[str] = ()) -> Attribution:
    """Verdicts for the ``corrupted`` engine request ids; ``echo_failed`` are those whose payload or
    cache key the harness found echoed wrong (the echo oracle); ``known_bad``: every request of the
    run found corrupted (``corrupted`` counts too), so that a bad donation from a corrupted donor is
    told apart from a writer bug."""
    book, echo, bad = _Ledger(ledger), set(echo_failed), {*known_bad, *corrupted}
    verdicts = tuple(_inherit(_verdict(book, rid, rid in echo), bad) for rid in corrupted)
    return Attribution(verdicts, _hypotheses(verdicts, bool(book.rows)), _windows(verdicts))


def _verdict(book: _Ledger, rid: str, echo_failed: bool) -> Verdict:
    if echo_failed:
        return Verdict(rid, "key-or-payload", (), ("key-or-payload",))
    checked: list[str] = []
    restore = book.find("restore_read", rid=rid)
    if restore:
        state = _state_path(book, restore[0], checked)
        if state is not None:
            return state
    stale = [r for r in book.find("decode_metadata", rid=rid) if not r.get("match", True)]
    checked.append("stale-metadata")
    if stale:
        return Verdict(rid, "stale-metadata", tuple(stale[:3]), tuple(checked))
    shared = book.find("shared_page_write", rid=rid) or _sibling_rows(book, rid, "shared_page_write")
    checked.append("cow-violation")
    if shared:
        return Verdict(rid, "cow-violation", tuple(shared[:3]), tuple(checked))
    concurrent = _stale_elsewhere(book, rid)
    if concurrent:
        return Verdict(rid, "stale-metadata", tuple(concurrent[:3]), tuple(checked))
    return Verdict(rid, "state-clean", tuple(restore), tuple(checked))


def _stale_elsewhere(book: _Ledger, rid: str) -> list[Row]:
    """Decode steps of *other* requests that read stale page mappings before ``rid`` finished: a
    decode reading the wrong table writes its keys and values into the pages that table names --
    pages this request reads, live or as a cached prefix it hit later."""
    own = [r["seq"] for r in book.rows if r.get("rid") == rid]
    if not own:
        return []
    return [r for r in book.find("decode_metadata", before=max(own) + 1)
            if not r.get("match", True) and r.get("rid") != rid]


def _inherit(verdict: Verdict, bad: set[str]) -> Verdict:
    """A bad donation whose donor was itself a corrupted request passed its poison on: the state it
    was computed from was wrong, which says nothing about the snapshot writer."""
    if verdict.verdict != "bad-at-donate":
        return verdict
    donors = [r.get("rid") for r in verdict.evidence if r["type"] == "donate"]
    donor = next((d for d in donors if d in bad and d != verdict.request), None)
    return verdict if donor is None else replace(verdict, inherited=donor)


def _state_path(book: _Ledger, read: Row, checked: list[str]) -> Verdict | None:
    """The restore -> donation -> reference chain of one restore; None when it is all clean."""
    rid, src, seq = read["rid"], read["src"], read["seq"]
    host = book.find("restore", rid=rid)
    prefix = host[0].get("prefix") if host else None
    donations = [d for d in book.find("donate", before=seq, slot=src) if d.get("stored", True)]
    if not donations:
        return None  # the ledger does not reach back to the donation: nothing to test
    donation = donations[-1]
    window = f"{donation.get('prefix')}@{donation['seq']}"
    checked.append("evicted-under-lock")
    reused = book.find("alloc", after=donation["seq"], before=seq, slot=src)
    if reused:
        return Verdict(rid, "evicted-under-lock", (donation, *reused[:2], read), tuple(checked), window)
    donated = _donated_bytes(book, donation)
    checked.append("restore-raced")
    if donated is not None and donated["seq"] > seq:
        return Verdict(rid, "restore-raced", (donation, read, donated), tuple(checked), window)
    reference = book.find("reference_state", prefix=donation.get("prefix") or prefix)
    blind = [r for r in (read, donated, *reference[-1:]) if r is not None and _unlanded(r)]
    if blind:
        return Verdict(rid, "ledger-unlanded", (donation, *blind), tuple(checked), window)
    checked.append("restore-incomplete")
    if read.get("checksum") is not None and read["checksum"] != read["src_checksum"]:
        return Verdict(rid, "restore-incomplete", (donation, read), tuple(checked), window)
    bad_at_donate = donated is None or bool(reference and reference[-1]["checksum"] != donated["checksum"])
    if reference or donated is None:
        checked.append("bad-at-donate")  # tested here even when a verdict earlier in the list wins
    checked.append("poisoned-after-donate")
    if donated is not None and read["src_checksum"] != donated["checksum"]:
        writes = [w for t in ("slot_write", "snapshot_write")
                  for w in book.find(t, after=donation["seq"], before=seq, slot=src)]
        return Verdict(rid, "poisoned-after-donate", (donation, donated, *writes[:2], read), tuple(checked), window)
    if donated is not None and donated["type"] == "clone_written":
        checked.append("freed-in-flight")
        freed = _freed_under_clone(book, donation, donated)
        if freed:
            return Verdict(rid, "freed-in-flight", (donation, *freed, donated, read), tuple(checked), window)
    if bad_at_donate:
        proof = (donation, *([donated] if donated else []), *reference[-1:], read)
        return Verdict(rid, "bad-at-donate", proof, tuple(checked), window)
    return None


def unlanded(ledger: Iterable[Row]) -> list[Row]:
    """The rows holding a state digest that reads ``UNLANDED``: what the engine's instrumentation failed to see."""
    return [r for r in ledger if _unlanded(r)]


def unlanded_note(count: int) -> str:
    """What ``count`` unlanded digests say (``hammer analyze``'s table, the run report, the post-mortem)."""
    return (f"{count} state digest(s) read 0: they never landed (the engine's instrumentation failed, not its "
            "slots); not evidence, and a verdict resting on one reads ledger-unlanded")


def _unlanded(row: Row) -> bool:
    return any(row.get(f) == UNLANDED for f in STATE_DIGESTS.get(row["type"], ()))


def donated_states(ledger: Iterable[Row]) -> list[tuple[Row, Row | None]]:
    """Every restore's source read (``restore_read``) of one engine's ledger, with the row holding the
    checksum of what the tree was given in that slot (None: the ledger does not reach the donation,
    or no forward wrote the donated state). A read whose ``src_checksum`` differs from that checksum
    restored a state changed after donation, unless either digest is ``UNLANDED`` (``unlanded``). Checksums
    compare copies of the same bytes: exact on any device."""
    book = _Ledger(ledger)
    pairs = []
    for read in book.find("restore_read"):
        donations = [d for d in book.find("donate", before=read["seq"], slot=read["src"]) if d.get("stored", True)]
        pairs.append((read, _donated_bytes(book, donations[-1]) if donations else None))
    return pairs


def _donated_bytes(book: _Ledger, donation: Row) -> Row | None:
    """The row holding the checksum of what the tree received: the clone written into the tree's
    slot (copy), or the last forward write of that slot at that position before it was handed over
    (transfer). None: no forward ever wrote the donated state."""
    slot, seq = donation["slot"], donation["seq"]
    if donation.get("policy") == "copy":
        # The clone op runs after the host's donate row on the sim and before it on cuda (issue order).
        clones = book.find("clone_written", dst=slot)
        return min(clones, key=lambda c: abs(c["seq"] - seq)) if clones else None
    writes = [w for t in ("slot_write", "snapshot_write")
              for w in book.find(t, before=seq, slot=slot, position=donation["position"])]
    return max(writes, key=lambda w: w["seq"]) if writes else None


def _freed_under_clone(book: _Ledger, donation: Row, clone: Row) -> list[Row]:
    """The donor's snapshot write into the clone's source, the source's free and its next alloc, when the
    slot was freed before the clone read it and the clone read other bytes than that write left (the
    next owner's first write ran first). Empty when the clone read what the donor wrote, or when no
    forward of the donor wrote that snapshot (a writer bug, not a reuse)."""
    src, read = clone["src"], clone.get("src_checksum", clone["checksum"])
    writes = book.find("snapshot_write", before=clone["seq"], rid=donation["rid"], slot=src,
                       position=donation["position"])
    if not writes or writes[-1]["checksum"] == read:
        return []
    frees = book.find("free", after=writes[-1]["seq"], before=clone["seq"], slot=src)
    if not frees:
        return []
    return [writes[-1], frees[0], *book.find("alloc", after=frees[0]["seq"], before=clone["seq"], slot=src)[:1]]


def _sibling_rows(book: _Ledger, rid: str, type_: str) -> list[Row]:
    """Rows of the other choices of the same n > 1 request (``rid#i``): sharing is mutual."""
    base = rid.split("#")[0]
    return [r for r in book.find(type_) if str(r.get("rid", "")).split("#")[0] == base and r.get("rid") != rid]


def inherited_detail(count: int) -> str:
    """What a hypothesis's status says when only inherited bad donations speak of it."""
    return f"{count} bad donation(s), each from a donor that was itself corrupted (poison passed on, not a writer bug)"


def _hypotheses(verdicts: Sequence[Verdict], have_ledger: bool) -> tuple[dict[str, Any], ...]:
    """Per hypothesis: confirmed (some verdict proves it), falsified (tested on failures, never
    matched) or untested (no failure could test it, or no ledger)."""
    out = []
    for name, text in HYPOTHESES.items():
        proven = sum(v.verdict == name and v.inherited is None for v in verdicts)
        inherited = sum(v.verdict == name and v.inherited is not None for v in verdicts)
        tested = sum(name in v.checked and v.inherited is None for v in verdicts)
        if proven:
            status, detail = "confirmed", f"{proven} of {len(verdicts)} failures"
        elif inherited:
            status, detail = "untested", inherited_detail(inherited)
        elif tested and have_ledger:
            status, detail = "falsified", f"evidence clean on all {tested} failures that could test it"
        else:
            status, detail = "untested", "no failure could test it" if have_ledger else "no ledger"
        out.append({"hypothesis": name, "description": text, "status": status, "detail": detail})
    return tuple(out)


def _windows(verdicts: Sequence[Verdict]) -> tuple[dict[str, Any], ...]:
    """Sticky windows: failures grouped by the donation (branch) they restored from."""
    counts: dict[str, list[str]] = {}
    for v in verdicts:
        if v.window is not None:
            counts.setdefault(v.window, []).append(v.request)
    return tuple({"window": w, "failures": len(r), "requests": r} for w, r in counts.items())
