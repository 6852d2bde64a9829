"""Oracles: pure functions ``oracle(record, context) -> Check`` over folded history records.

Strongest first (DESIGN.md §5): *reference* (a hammered request must be token-identical to the
same request run cold and alone; on an exact engine that reports a ``logits_digest``, the logits
every token was sampled from must be bit-identical too), *ground truth* (the extracted answer equals the expected one),
*content forensics* (empty, special-token leak, garbage, runaway repetition) and *echo* (the
forensic fields the engine returned match what was sent).

Ground truth and content count as corruption only where the cold control does *not* show the same
thing: a control that is wrong too means the model is wrong (``model-wrong``), not the cache.
Oracles see only completed (``ok``) records; ``probes.verdicts`` handles the rest.

Check labels: ``ok`` / ``n/a`` (valid), ``mismatch`` / ``logits-mismatch`` / ``wrong`` / ``found`` (invalid; corruption
when counted), ``model-wrong`` (invalid, not corruption), ``no-control`` / ``error`` (unknown).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from forensics import RequestRecord
from forensics.divergence import first_mismatch
from probes.content import garbage_ratio, is_empty, runaway_repetition, special_token_leaks
from probes.extract import extract

__all__ = ["CONTROL_ARM", "Check", "Context", "ORACLES", "UNKNOWN", "build_context"]

UNKNOWN = "unknown"
CONTROL_ARM = "control-cold"
PREVIEW = 80  # characters of each output kept in a mismatch's details


@dataclass(frozen=True)
class Check:
    valid: bool | str  # True | False | "unknown"
    label: str
    corruption: bool = False  # counts toward the row's ``corrupted``
    details: Mapping[str, Any] = field(default_factory=dict)


OK = Check(True, "ok")
NOT_APPLICABLE = Check(True, "n/a")


@dataclass(frozen=True)
class Context:
    """Run-wide facts the oracles consult; built once by ``build_context``.

    ``controls``: (request key, choice) -> the first completed control record; ``exact``: the
    engine is hit-invariant, so a reference mismatch is a defect (False for e.g. bf16 engines: the
    mismatch is reported but not counted).
    """

    controls: Mapping[tuple[str, int], RequestRecord]
    cache_keys_by_payload: Mapping[str, frozenset[str]]
    payloads_by_cache_key: Mapping[str, frozenset[str]]
    exact: bool = True

    def control_of(self, record: RequestRecord) -> RequestRecord | None:
        return self.controls.get((record.key, record.choice))


def build_context(records: Iterable[RequestRecord], *, exact: bool = True) -> Context:
    controls: dict[tuple[str, int], RequestRecord] = {}
    keys_by_payload: dict[str, set[str]] = defaultdict(set)
    payloads_by_key: dict[str, set[str]] = defaultdict(set)
    for record in records:
        if record.outcome != "ok":
            continue
        if record.arm == CONTROL_ARM:
            controls.setdefault((record.key, record.choice), record)
        payload, cache_key = record.invoke.get("payload"), (record.end.get("forensic") or {}).get("cache_key")
        if payload is not None and cache_key is not None:
            keys_by_payload[payload].add(cache_key)
            payloads_by_key[cache_key].add(payload)
    return Context(controls, {p: frozenset(k) for p, k in keys_by_payload.items()},
                   {k: frozenset(p) for k, p in payloads_by_key.items()}, exact)


def reference(record: RequestRecord, ctx: Context) -> Check:
    """Token-identical to the cold control (token ids when both have them, else text)."""
    if record.arm == CONTROL_ARM:
        return NOT_APPLICABLE
    control = ctx.control_of(record)
    if control is None:
        return Check(UNKNOWN, "no-control", details={"key": record.key})
    ours, theirs = record.token_ids, control.token_ids
    if ours is None or theirs is None:
        ours, theirs = record.text, control.text
    if ours == theirs:
        return _same_logits(record, control, ctx)
    first = first_mismatch(ours, theirs)
    details = {"control": control.request, "first_difference": first, "compared": "token_ids"
               if isinstance(ours, tuple) else "text", "output": record.text[:PREVIEW],
               "control_output": control.text[:PREVIEW]}
    if not ctx.exact:
        details["note"] = "inexact engine: the difference is reported, not counted as corruption"
    return Check(False, "mismatch", corruption=ctx.exact, details=details)


def _same_logits(record: RequestRecord, control: RequestRecord, ctx: Context) -> Check:
    """Same tokens: on an exact engine that reports ``logits_digest`` for both, the logits must be
    bit-identical too. A difference is a corrupted state that has not changed a token yet."""
    ours, theirs = ((r.end.get("forensic") or {}).get("logits_digest") for r in (record, control))
    if ours is None or theirs is None or ours == theirs or not ctx.exact:
        return OK
    return Check(False, "logits-mismatch", corruption=True,
                 details={"control": control.request, "logits_digest": ours, "control_logits_digest": theirs,
                          "note": "same tokens as the cold control, sampled from different logits"})


def ground_truth(record: RequestRecord, ctx: Context) -> Check:
    """The extracted answer equals the probe's expected answer (corruption only if the control got it)."""
    probe = record.probe
    if not probe:
        return NOT_APPLICABLE

    def answer(r: RequestRecord) -> str | None:
        return extract(probe["extract"], r.text)

    got = answer(record)
    if got == probe["expected"]:
        return OK
    return _against_control(record, ctx, {"expected": probe["expected"], "answer": got},
                            lambda control: answer(control) != probe["expected"], label="wrong")


def _content(symptom: Callable[[str], Any]) -> Callable[[RequestRecord, Context], Check]:
    """An oracle that fires when ``symptom(text)`` is truthy (it returns what it found)."""

    def oracle(record: RequestRecord, ctx: Context) -> Check:
        found = symptom(record.text)
        if not found:
            return OK
        return _against_control(record, ctx, {"found": _plain(found)}, lambda control: bool(symptom(control.text)),
                                label="found")

    oracle.__doc__ = symptom.__doc__
    return oracle


def _against_control(record: RequestRecord, ctx: Context, details: dict[str, Any],
                     control_fails: Callable[[RequestRecord], bool], *, label: str) -> Check:
    """An invalid finding, counted as corruption only when the cold control does not fail the same way."""
    if record.arm == CONTROL_ARM:
        return Check(False, "model-wrong", details=details)
    control = ctx.control_of(record)
    if control is None:
        return Check(UNKNOWN, "no-control", details=details)
    if control_fails(control):
        return Check(False, "model-wrong", details={**details, "control": control.request})
    return Check(False, label, corruption=True, details={**details, "control": control.request})


def _plain(found: Any) -> Any:
    """A finding as plain JSON data for a check's details."""
    if is_dataclass(found):
        return asdict(found)
    return list(found) if isinstance(found, tuple) else found


def garbage_over(threshold: float) -> Callable[[str], str | None]:
    def garbled(text: str) -> str | None:
        """More than ``threshold`` of the characters are replacement or non-printable characters."""
        ratio = garbage_ratio(text)
        return f"garbage ratio {ratio:.2f} > {threshold}" if ratio > threshold else None

    return garbled


def echo(record: RequestRecord, ctx: Context) -> Check:
    """The engine's echoed forensic fields match what was sent, and cache keys map 1:1 to payloads."""
    sent, usage = record.invoke, record.end.get("usage") or {}
    forensic = record.end.get("forensic") or {}
    problems = []
    if "media_digest" in forensic and "media_digest" in sent and forensic["media_digest"] != sent["media_digest"]:
        problems.append(f"media digest {forensic['media_digest']} != sent {sent['media_digest']}")
    echoed_tokens = usage.get("prompt_tokens", forensic.get("prompt_tokens"))
    if echoed_tokens is not None and "prompt_tokens" in sent and echoed_tokens != sent["prompt_tokens"]:
        problems.append(f"prompt_tokens {echoed_tokens} != sent {sent['prompt_tokens']}")
    payload, cache_key = sent.get("payload"), forensic.get("cache_key")
    if payload is not None and cache_key is not None:
        if len(ctx.cache_keys_by_payload.get(payload, ())) > 1:
            problems.append(f"this payload was served under {len(ctx.cache_keys_by_payload[payload])} cache keys")
        if len(ctx.payloads_by_cache_key.get(cache_key, ())) > 1:
            problems.append(f"cache key {cache_key} is shared by {len(ctx.payloads_by_cache_key[cache_key])} "
                            "different payloads (media or model id left out of the key?)")
    if not problems:
        return OK if (forensic or usage) else NOT_APPLICABLE
    return Check(False, "mismatch", corruption=record.arm != CONTROL_ARM, details={"problems": problems})


def _empty(text: str) -> bool:
    """The output is empty or whitespace only."""
    return is_empty(text)


ORACLES: dict[str, Callable[[RequestRecord, Context], Check]] = {
    "reference": reference,
    "ground_truth": ground_truth,
    "empty": _content(_empty),
    "special_leak": _content(special_token_leaks),
    "garbage": _content(garbage_over(0.2)),
    "repetition": _content(runaway_repetition),
    "echo": echo,
}
