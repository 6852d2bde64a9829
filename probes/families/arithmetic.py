"""Exact-match arithmetic: ``Compute 347+86. Answer:`` -> ``433``.

Every probe starts with the same instruction preamble and worked examples (well past two 64-token
chunks), so a run of arithmetic probes is many short suffixes on one long cached prefix.
"""

from __future__ import annotations

from probes.probe import Probe
from probes.seeding import probe_id, settings_tag, stable_rng

__all__ = ["PREAMBLE", "generate", "probe", "question"]

PREAMBLE = (
    "You are a careful calculator. Compute each expression exactly, in integers, and reply with the "
    "number only: no words, no units, no working.\n"
    "Compute 12+7. Answer: 19\n"
    "Compute 45-18. Answer: 27\n"
    "Compute 6*7. Answer: 42\n"
    "Compute 250+175. Answer: 425\n"
    "Compute 903-456. Answer: 447\n"
)
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def generate(seed: int, count: int, *, digits: int = 3, operations: tuple[str, ...] = ("+", "-")) -> tuple[Probe, ...]:
    """``count`` probes with operands of up to ``digits`` digits (the first has exactly ``digits``)."""
    if digits < 1:
        raise ValueError(f"digits must be >= 1; got {digits}")
    unknown = [op for op in operations if op not in OPERATIONS]
    if not operations or unknown:
        raise ValueError(f"operations must be a non-empty subset of {tuple(OPERATIONS)}; got {operations!r}")
    settings = {"digits": digits, "operations": list(operations)}
    group = f"arithmetic/{settings_tag(settings)}"
    return tuple(probe(probe_id("arithmetic", settings, seed, i), group, PREAMBLE, digits, operations)
                 for i in range(count))


def question(pid: str, digits: int = 3, operations: tuple[str, ...] = ("+", "-")) -> tuple[str, str]:
    """``("Compute 347+86. Answer:", "433")``, drawn from the probe id's own seed."""
    rng = stable_rng(pid)
    op = rng.choice(operations)
    a, b = rng.randint(10 ** (digits - 1), 10 ** digits - 1), rng.randint(1, 10 ** digits - 1)
    if op == "-" and b > a:
        a, b = b, a  # answers stay non-negative: a sign is one more thing a wrong answer could hide in
    return f"Compute {a}{op}{b}. Answer:", str(OPERATIONS[op](a, b))


def probe(pid: str, group: str, before: str = PREAMBLE, digits: int = 3,
          operations: tuple[str, ...] = ("+", "-")) -> Probe:
    """The probe of ``question(pid)`` with ``before`` in front of it (the preamble, a pattern's prefix)."""
    text, answer = question(pid, digits, operations)
    return Probe(id=pid, family="arithmetic", expected=answer, extract="first_number", group=group,
                 prompt=before + text, max_tokens=len(answer) + 4)
