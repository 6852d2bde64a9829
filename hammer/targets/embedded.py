"""The embedded target: an in-process ``Engine`` in virtual time on the ``sim`` device.

A run is a function of its seeds: the ops (pattern seed), the engine options and the device seed.
Round ``r`` of a soak runs on fresh engines whose device seed is ``device_seed + r``, so each
round replays on its own (on cuda a seed of 0, the GPU's own timing, stays 0: ``round_device_seed``). Two engines per round:

    hammer lane    the engine under test: the options as given (faults, overlap, ...), cache on
    control lane   the reference: the same engine with the cache off and every safeguard on;
                   the interpreter runs each control on it alone, one at a time

Every instrumentation event of both engines becomes a ledger row (the raw event plus ``engine``
and ``round``); the hammer engine's ``fault`` events are also handed to the interpreter, which
writes them into the history.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forensics import choice_request_id
from forensics.ledger import LedgerWriter
from hammer.patterns import CONTROL_ARM, HAMMER_ARM, Op
from hammer.targets.base import Completion, Delta, Failure, Lane, SteppedTarget, Update
from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.model import HybridModel, load_model

__all__ = ["ENGINE_OPTIONS", "EmbeddedTarget", "LedgerWriter", "round_device_seed"]

# The engine options a run may set (EngineConfig fields), recorded in meta.json's ``engine``.
ENGINE_OPTIONS = ("model", "overlap", "device", "device_seed", "dtype", "max_running", "num_slots", "num_pages",
                  "page_size", "prefill_chunk", "max_context", "faults", "reference_states", "state_digests")


class EngineLane(Lane):
    """One engine, driven by the interpreter; requests are submitted under their op's request id."""

    def __init__(self, engine_of: Any, name: str, round_index: int, ledger: LedgerWriter | None) -> None:
        super().__init__()
        self.name, self.round, self.ledger = name, round_index, ledger
        self.engine: Engine = engine_of(self._sink)
        self._choices: dict[str, list[str]] = {}
        self._seen: dict[str, int] = {}
        self._reported: set[str] = set()

    def _sink(self, event: dict[str, Any]) -> None:
        if self.ledger is not None:
            self.ledger.write({"engine": self.name, "round": self.round, **event})
        if event["type"] == "fault":
            self._faults.append(event)

    def submit(self, op: Op) -> Failure | None:
        tokenizer = self.engine.tokenizer
        prompt = op.prompt if op.prompt is not None else tokenizer.apply_chat_template(
            [m.as_dict() for m in op.messages])
        params = SamplingParams(max_tokens=op.max_tokens, temperature=op.temperature, seed=op.seed,
                                stop_token_ids=tokenizer.eos_token_ids, stop=op.stop)
        try:
            self.engine.submit(prompt, params, rid=op.request, n=op.n, media=list(op.media))
        except ValueError as error:
            return Failure(f"the engine refused the request: {error}")
        self._choices[op.request] = [choice_request_id(op.request, i) for i in range(op.n)]
        return None

    def step(self) -> None:
        self.engine.step()
        if self.ledger is not None:
            self.ledger.flush()

    def observe(self, request: str) -> list[Update]:
        updates: list[Update] = []
        for choice, rid in enumerate(self._choices[request]):
            streamed, finish_reason = self.engine.poll(rid)
            seen, self._seen[rid] = self._seen.get(rid, 0), streamed
            decode = self.engine.tokenizer.decode
            # A token's text is the token decoded alone: one byte of a multi-byte character reads U+FFFD.
            updates += [Delta(choice, decode([t], skip_special=True), t) for t in self.engine.tokens(rid, seen)]
            if finish_reason in ("stop", "length") and rid not in self._reported:
                self._reported.add(rid)
                updates.append(_completion(choice, self.engine.result(rid)))
        return updates

    def abort(self, request: str) -> None:
        self.engine.abort(request)

    def busy(self) -> bool:
        return not self.engine.idle()


def _completion(choice: int, result: Any) -> Completion:
    forensic = {"cache_key": result.cache_key, "prompt_tokens": result.prompt_tokens,
                "restored_slot": result.restored_slot, "cached_tokens": result.cached_tokens}
    if result.media_digest is not None:
        forensic["media_digest"] = result.media_digest
    if result.logits_digest is not None:
        forensic["logits_digest"] = result.logits_digest
        forensic["logit_checks"] = list(result.logit_checks)  # per token: where a hit's logits part from its control
    usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": len(result.output_ids)}
    return Completion(choice, result.text, tuple(result.output_ids), result.finish_reason, result.cached_tokens,
                      usage, forensic)


def round_device_seed(engine: Mapping[str, Any], index: int) -> int:
    """The device seed of round ``index``: ``device_seed + index``, so each round replays on its own. On cuda a
    base seed of 0 stays 0 in every round: there 0 is the GPU's own timing and any other seed turns the
    stream-delay nemesis on (``mini_engine.device.cuda``), which a run must ask for."""
    base = int(engine.get("device_seed", 0))
    return base if engine.get("device") == "cuda" and base == 0 else base + index


class EmbeddedTarget(SteppedTarget):
    """``options``: EngineConfig fields (``ENGINE_OPTIONS``); ``ledger``: where the ledger goes (None: nowhere)."""

    kind = "embedded"

    def __init__(self, options: Mapping[str, Any] | None = None, *, ledger: str | os.PathLike | None = None,
                 model: HybridModel | None = None) -> None:
        options = dict(options or {})
        unknown = sorted(set(options) - set(ENGINE_OPTIONS))
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; known: {', '.join(ENGINE_OPTIONS)}")
        options["faults"] = tuple(sorted(options.get("faults", ())))
        self.config = EngineConfig(**options)  # validates: a bad option is a ValueError naming its field
        self.options = options
        self.model = model if model is not None else load_model(self.config.model)
        self.ledger = LedgerWriter(ledger) if ledger is not None else None
        self._lanes: dict[str, EngineLane] = {}

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.config.device, "model": self.model.config.name,
                "exact": self.config.bit_exact}

    def engine(self) -> dict[str, Any]:
        return {**self.options, "faults": list(self.options["faults"])}

    @property
    def faults(self) -> tuple[str, ...]:
        return tuple(sorted(self.config.faults))

    @property
    def controls(self) -> str:
        return "cold and alone on a separate engine: cache off, every safeguard on, one at a time"

    def attach(self, run_dir: str | os.PathLike) -> None:
        if self.ledger is None:
            self.ledger = LedgerWriter(Path(run_dir) / "ledger.jsonl")

    def begin_round(self, index: int) -> None:
        hammer = {**self.options, "device_seed": round_device_seed(self.options, index)}
        control = {**hammer, "faults": (), "enable_cache": False}
        self._release()  # the last round's engines go before this round's are built: never two rounds' pools at once
        self._lanes = {HAMMER_ARM: EngineLane(self._engine_of(hammer), "hammer", index, self.ledger),
                       CONTROL_ARM: EngineLane(self._engine_of(control), "control", index, self.ledger)}

    def _engine_of(self, options: Mapping[str, Any]) -> Any:
        return lambda sink: Engine(EngineConfig(**options), model=self.model, sink=sink)

    def lane(self, arm: str) -> EngineLane:
        if not self._lanes:
            self.begin_round(0)
        return self._lanes[arm]

    def close(self) -> None:
        self._release()
        if self.ledger is not None:
            self.ledger.close()

    def _release(self) -> None:
        """Free the lanes' engines now. An engine sits in reference cycles (its lane's ledger sink, its cache manager's
        callbacks into it), which only the cyclic GC frees, whenever it next runs: until then a finished round's slot
        pools (6 GB an engine on the 0.8B model, on the GPU) stay allocated, and an H100 ran out of memory."""
        if self._lanes:
            self._lanes = {}
            gc.collect()
