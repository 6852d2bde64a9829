"""Where a run and its control part: per request, the first position whose state differs, or else the first
token whose logits differ.

The attribution (``forensics.attribute``) explains a corrupted hit by the ledger of one run. This compares two
ledgers of the same requests (the same ``rid``s, the same prompts), typically a hit-heavy run and the same
requests with the cache off, on an engine that claims a hit gives its cold run's bits. A request's live slot is
written after each of its forwards (``slot_write``: position, checksum of the state the forward left), and the
run and the control write it at many of the same positions: every decode token's, and the prompt's end. The
first position where the checksums part says where the computation parted::

    control  |0 ........ 64 ....... 128 .... 171|172|173|174|175|   (cold: every position its own)
    run      |restored at 128 ......... 171|172|173|174|175|         (a hit: the first forward starts at 128)
                                           ^ compared from the first position both wrote

- the state parted at position p: the forward that ended at p computed the slot otherwise (a batch-variant kernel,
  or a restore that brought other bytes; its ``batch`` in each run says what it was packed with);
- no position parted, but a token's logits did (``logits``, per output token, instrumented engines only): the path
  from the state to the logits (the layers after the last linear one, the head), at that token's forward.

Pure functions of the rows; nothing here runs a model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from forensics.attribute import UNLANDED
from forensics.ledger import checksum_format, streams

__all__ = ["Divergence", "divergences", "first_mismatch", "partings"]

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Divergence:
    """Request ``rid``'s first difference between a run and its control (see the module doc).

    ``compared``: positions whose live state both wrote; ``state_at``: the first of them whose checksum differs
    (None: none did); ``packed``: the items of the batch that wrote it, in the run and in the control; ``token``:
    the first output token whose logits check differs (None: none did, or no checks were given); ``restored_at``:
    the position the run restored the request's state at (None: it restored nothing); ``first_forward``: whether
    ``state_at`` ends the run's first forward of the request (after its restore, if any); ``formats``: the two
    ledgers' state checksum formats where they differ (their checksums were then not compared)."""

    rid: str
    compared: int
    state_at: int | None = None
    packed: tuple[int, int] | None = None
    token: int | None = None
    restored_at: int | None = None
    first_forward: bool = False
    formats: tuple[str, str] | None = None

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> Divergence:
        """A divergence from its ``asdict`` form (JSON: ``packed`` a list), other keys ignored."""
        known = {k: v for k, v in fields.items() if k in cls.__dataclass_fields__}
        packed, formats = known.get("packed"), known.get("formats")
        return cls(**{**known, "packed": None if packed is None else tuple(packed),
                      "formats": None if formats is None else tuple(formats)})

    @property
    def parted(self) -> bool:
        return self.state_at is not None or self.token is not None

    def describe(self, run: str = "the run", control: str = "the control") -> str:
        """One sentence; ``run`` and ``control`` name the two ledgers."""
        who = self.rid if self.restored_at is None else f"{self.rid} (restored at {self.restored_at})"
        if self.state_at is not None:
            ours, theirs = self.packed or (0, 0)
            which = "its first forward" if self.first_forward else "a later forward"
            return (f"{who}: the live state first differs at position {self.state_at}, the end of {which} (packed "
                    f"with {ours} item(s) in all in {run}, {theirs} in {control})")
        states = (f"the live state is equal at all {self.compared} positions both runs wrote" if self.compared
                  else "no position was written by both runs")
        if self.formats is not None:
            states = (f"the runs checksum a state otherwise ({self.formats[0]} in {run}, {self.formats[1]} in "
                      f"{control}): their live states were not compared")
        if self.token is not None:
            return f"{who}: {states}; the logits first differ at output token {self.token}"
        return f"{who}: {states}"


def divergences(run: Iterable[Row], control: Iterable[Row], *, pairs: Mapping[str, str] | None = None,
                logits: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None,
                formats: tuple[str, str] | None = None) -> list[Divergence]:
    """Per request of the run (in its order) that has a control, where it first parted from the control.

    ``run``, ``control``: ledger rows (``slot_write`` and ``restore`` rows are read; others ignored), each the
    whole stream the requests ran in, so that a batch's items can be counted. A position written twice (a request
    recomputed after preemption) counts by its last write. ``pairs``: run rid -> its control's rid (default: the
    same rid, for every rid of the run). ``logits``: per run rid, the run's and the control's logits checks of each
    output token, in order (``RequestResult.logit_checks``). ``formats``: the two ledgers' state checksum formats,
    given where they differ: no position is then compared, the logits still are. Nor is a position where either
    digest reads 0 (it never landed: ``attribute.UNLANDED``)."""
    ours, theirs = _LiveWrites.of(run), _LiveWrites.of(control)
    pairs = pairs if pairs is not None else {rid: rid for rid in ours.by_rid}
    found = []
    for rid, written in ours.by_rid.items():
        other = theirs.by_rid.get(pairs.get(rid))
        if other is None:
            continue
        common = [] if formats is not None else [p for p in sorted(written.keys() & other.keys())
                                                 if UNLANDED not in (written[p]["checksum"], other[p]["checksum"])]
        state_at = next((p for p in common if written[p]["checksum"] != other[p]["checksum"]), None)
        packed = None if state_at is None else (ours.packed(written[state_at]), theirs.packed(other[state_at]))
        found.append(Divergence(rid, len(common), state_at, packed, _first_token(logits, rid),
                                ours.restored.get(rid), state_at is not None and state_at == min(written), formats))
    return found


def partings(ledger: Iterable[Row], controls: Mapping[str, str], *, control_ledger: Iterable[Row] | None = None,
             logits: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None) -> list[dict[str, Any]]:
    """For each request of ``controls`` (request -> its control's request) whose live slot the ledgers show
    written in both runs, where it first parted from its control: the ``Divergence`` as a dict (``from_dict`` reads
    it back), with ``control``. ``ledger``: the rows of a whole run, every engine stream (a request is compared in
    its own stream against its control's, so a batch's items are counted where it ran); ``control_ledger``: where
    the controls ran (default: the same ledger, the harness's cold controls). Two ledgers whose state checksum
    formats differ (``ledger.checksum_format``: two builds of an engine, one from before its format was named)
    compare logits alone."""
    if not controls:
        return []
    ledger = list(ledger)
    ours_by = streams(ledger)
    formats = None
    if control_ledger is not None:
        control_ledger = list(control_ledger)
        named = checksum_format(ledger), checksum_format(control_ledger)
        formats = None if named[0] == named[1] else tuple(name or "no format named" for name in named)
    theirs_by = ours_by if control_ledger is None else streams(control_ledger)
    ours_of, theirs_of = _stream_of(ours_by), _stream_of(theirs_by)
    groups: dict[tuple, dict[str, str]] = {}
    for request, control in controls.items():
        if request in ours_of and control in theirs_of:
            groups.setdefault((ours_of[request], theirs_of[control]), {})[request] = control
    found = []
    for (ours, theirs), pairs in groups.items():
        for d in divergences(ours_by[ours], theirs_by[theirs], pairs=pairs, logits=logits, formats=formats):
            found.append({**asdict(d), "control": pairs[d.rid]})
    return found


def _stream_of(by_stream: Mapping[tuple, Sequence[Row]]) -> dict[str, tuple]:
    """rid -> the stream its live slot was written in."""
    return {row["rid"]: key for key, rows in by_stream.items() for row in rows if row["type"] == "slot_write"}


@dataclass(frozen=True)
class _LiveWrites:
    by_rid: dict[str, dict[int, Row]]  # rid -> position -> the last slot_write of its live slot there
    batch_items: Counter  # batch -> live slots its forward wrote
    restored: dict[str, int]  # rid -> the position of its (last) restore

    @classmethod
    def of(cls, rows: Iterable[Row]) -> _LiveWrites:
        by_rid: dict[str, dict[int, Row]] = {}
        batch_items: Counter = Counter()
        restored: dict[str, int] = {}
        for row in rows:
            if row.get("type") == "slot_write":
                by_rid.setdefault(row["rid"], {})[int(row["position"])] = row
                batch_items[row.get("batch")] += 1
            elif row.get("type") == "restore":
                restored[row["rid"]] = int(row["position"])
        return cls(by_rid, batch_items, restored)

    def packed(self, row: Row) -> int:
        """The items of ``row``'s batch (0 when the rows carry no batch)."""
        return 0 if row.get("batch") is None else self.batch_items[row["batch"]]


def first_mismatch(ours: Sequence[Any], theirs: Sequence[Any]) -> int | None:
    """The first position where two sequences differ (where the shorter ends, if one is the other's prefix);
    None when they are equal."""
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                None if len(ours) == len(theirs) else min(len(ours), len(theirs)))


def _first_token(logits: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None, rid: str) -> int | None:
    if not logits or rid not in logits:
        return None
    return first_mismatch(*logits[rid])
