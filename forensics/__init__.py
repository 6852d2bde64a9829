"""forensics: the run-directory schema, slot ledger, attribution and shrinking (DESIGN.md §6).

The run directory is evidence: ``hammer`` writes it through ``RunDir`` / ``HistoryWriter``;
``probes`` and ``reports`` read it with ``read_history`` and ``fold_history``.
"""

from forensics.attribute import Attribution, Verdict, attribute
from forensics.history import HistoryWriter, read_history, read_jsonl
from forensics.records import Fold, RequestRecord, TokenDelta, fold_history
from forensics.rundir import RunDir, RunMeta, resolve_run
from forensics.schema import SCHEMA_VERSION, SchemaError, choice_request_id, media_digest

__all__ = [
    "SCHEMA_VERSION",
    "Attribution",
    "Fold",
    "HistoryWriter",
    "RequestRecord",
    "RunDir",
    "RunMeta",
    "SchemaError",
    "TokenDelta",
    "Verdict",
    "attribute",
    "choice_request_id",
    "fold_history",
    "media_digest",
    "read_history",
    "read_jsonl",
    "resolve_run",
]
