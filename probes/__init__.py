"""probes: ground-truth probe families and their oracles (DESIGN.md §5). Reads histories; never imports the engine."""

from probes.extract import EXTRACTORS, extract
from probes.families import FAMILIES, generate_probes
from probes.oracles import ORACLES, Check
from probes.probe import Probe
from probes.seeding import stable_seed
from probes.text import Message, count_tokens, render_chat
from probes.verdicts import Analysis, VerdictRow, check_history, check_run

__all__ = [
    "EXTRACTORS",
    "FAMILIES",
    "ORACLES",
    "Analysis",
    "Check",
    "Message",
    "Probe",
    "VerdictRow",
    "check_history",
    "check_run",
    "count_tokens",
    "extract",
    "generate_probes",
    "render_chat",
    "stable_seed",
]
