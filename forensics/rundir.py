"""A run directory: ``meta.json``, ``history.jsonl`` and (embedded runs) ``ledger.jsonl``.

    runs/
      20260509T073512Z-a1b2c3/     one run
        meta.json                  RunMeta: versions, target, engine config and faults, patterns, seeds
        history.jsonl              the events (forensics.schema), append-only
        ledger.jsonl               slot events (its schema arrives with the ledger; read as dicts)
      last -> 20260509T073512Z-a1b2c3    what ``--seed last`` / ``analyze last`` resolve

Opening a run and taking its ``writer()`` continues the same history: indices and times go on.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from forensics.history import HistoryWriter, read_history, read_jsonl
from forensics.schema import SCHEMA_VERSION, SchemaError

__all__ = ["LAST", "RunDir", "RunMeta", "resolve_run"]

META, HISTORY, LEDGER = "meta.json", "history.jsonl", "ledger.jsonl"
LAST = "last"


def _tool_version() -> str:
    try:
        return metadata.version("prefix-hammer")
    except metadata.PackageNotFoundError:
        return "unknown"


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RunMeta:
    """What a run was: enough to re-generate its schedule and to say what its numbers mean.

    ``patterns``: one ``{"name": ..., "settings": {...}}`` per pattern; ``seeds``: every seed the
    run used by role (``{"pattern": 7, "device": 3}``); ``start_time`` / ``end_time``: ISO-8601 UTC
    (``end_time`` is None while the run is going, or if it was killed).
    """

    target: Mapping[str, Any]
    patterns: tuple[Mapping[str, Any], ...]
    seeds: Mapping[str, int]
    engine: Mapping[str, Any] = field(default_factory=dict)
    faults: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    start_time: str = field(default_factory=_utc_now)
    end_time: str | None = None
    tool_version: str = field(default_factory=_tool_version)
    schema_version: int = SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.target, Mapping) or "kind" not in self.target:
            raise SchemaError(f"meta.target must be a mapping with a 'kind' (e.g. embedded, http); got {self.target!r}")
        for i, pattern in enumerate(self.patterns):
            if not isinstance(pattern, Mapping) or not isinstance(pattern.get("name"), str):
                raise SchemaError(f"meta.patterns[{i}] must be a mapping with a 'name'; got {pattern!r}")
        bad = {k: v for k, v in self.seeds.items() if not isinstance(v, int) or isinstance(v, bool)}
        if bad:
            raise SchemaError(f"meta.seeds values must be ints; got {bad}")
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"this run was written with schema version {self.schema_version}; this tool reads "
                              f"version {SCHEMA_VERSION}: analyze it with the tool version that wrote it "
                              f"({self.tool_version})")
        object.__setattr__(self, "patterns", tuple(self.patterns))
        object.__setattr__(self, "faults", tuple(self.faults))
        object.__setattr__(self, "command", tuple(self.command))

    @property
    def exact(self) -> bool:
        """Whether a hit that differs from its control counts as corruption: the target's own word
        (``target["exact"]``: a bit-exact engine), else yes for the embedded engine (older runs)."""
        return bool(self.target.get("exact", self.target.get("kind") == "embedded"))

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))  # plain JSON types all the way down

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunMeta:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SchemaError(f"meta.json has unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass(frozen=True)
class RunDir:
    """An existing run directory and its meta; ``create`` makes one, ``open`` reads one."""

    path: Path
    meta: RunMeta

    @property
    def history_path(self) -> Path:
        return self.path / HISTORY

    @property
    def ledger_path(self) -> Path:
        return self.path / LEDGER

    @classmethod
    def create(cls, root: str | os.PathLike, meta: RunMeta, *, path: str | os.PathLike | None = None,
               link_last: bool = True) -> RunDir:
        """Make ``root/<UTC timestamp>-<short id>`` (or exactly ``path``), write its meta and an empty
        history, and point ``root/last`` at it."""
        root = Path(root)
        target = Path(path) if path is not None else _fresh_name(root)
        if target.exists() and any(target.iterdir()):
            raise FileExistsError(f"{target} already holds files; open it with RunDir.open to resume, "
                                  "or choose an empty path")
        target.mkdir(parents=True, exist_ok=True)
        run = cls(target, meta)
        run._write_meta()
        run.history_path.touch()
        if link_last:
            _point_last(root, target)
        return run

    @classmethod
    def open(cls, path: str | os.PathLike) -> RunDir:
        """Read an existing run directory (``root/last`` works too)."""
        path = Path(path)
        if path.name == LAST and not (path / META).exists():
            path = resolve_run(path.parent, LAST)
        meta_file = path / META
        if not meta_file.exists():
            raise FileNotFoundError(f"{path} is not a run directory (no {META}); pass a folder "
                                    "that `hammer run` created, or ROOT/last")
        return cls(path, RunMeta.from_dict(json.loads(meta_file.read_text(encoding="utf-8"))))

    def writer(self, **kwargs: Any) -> HistoryWriter:
        """The history's writer, continuing after whatever the history already holds."""
        return HistoryWriter.resume(self.history_path, **kwargs)

    def history(self) -> list[dict[str, Any]]:
        return read_history(self.history_path) if self.history_path.exists() else []

    def ledger(self) -> Iterator[dict[str, Any]]:
        """Ledger rows as dicts (nothing when the run has no ledger)."""
        if self.ledger_path.exists():
            yield from read_jsonl(self.ledger_path)

    def finish(self, end_time: str | None = None) -> RunDir:
        """Record the end time in meta.json; returns the updated RunDir."""
        done = replace(self, meta=replace(self.meta, end_time=end_time or _utc_now()))
        done._write_meta()
        return done

    def _write_meta(self) -> None:
        scratch = self.path / f".{META}.tmp"
        scratch.write_text(json.dumps(self.meta.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(scratch, self.path / META)  # a reader never sees half a meta file


def resolve_run(root: str | os.PathLike, spec: str | os.PathLike) -> Path:
    """``"last"`` -> the run ``root/last`` points at; anything else is taken as a path."""
    if str(spec) != LAST:
        return Path(spec)
    pointer = Path(root) / LAST
    if pointer.is_symlink():
        return (pointer.parent / os.readlink(pointer)).resolve()
    if pointer.is_file():
        return (pointer.parent / pointer.read_text(encoding="utf-8").strip()).resolve()
    raise FileNotFoundError(f"no previous run under {root} ({pointer} is missing); run `hammer run` first")


def _fresh_name(root: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    while True:
        candidate = root / f"{stamp}-{secrets.token_hex(3)}"
        if not candidate.exists():
            return candidate


def _point_last(root: Path, target: Path) -> None:
    """Atomically repoint ``root/last``: a relative symlink, or a one-line file where links fail."""
    root.mkdir(parents=True, exist_ok=True)
    pointer, scratch = root / LAST, root / f".{LAST}.{secrets.token_hex(3)}"
    destination = os.path.relpath(target.resolve(), root.resolve())
    try:
        os.symlink(destination, scratch)
    except OSError:
        scratch.write_text(destination + "\n", encoding="utf-8")
    os.replace(scratch, pointer)
