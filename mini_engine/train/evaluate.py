"""Per-family probe accuracy: greedy, cold, each probe as the harness sends it.

Two ways to ask, same probes: ``recompute`` runs the dense training forward over the whole sequence for
every new token (any device, no cache at all: what the training loop uses between steps), and
``engine`` submits each probe alone to a ``mini_engine`` engine with its prefix cache off (the cold
accuracy the harness's ground truth relies on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from mini_engine.model.hybrid import HybridModel
from mini_engine.model.tokenizer import ByteTokenizer
from mini_engine.ops import invariant as inv
from mini_engine.train.data import media_rows
from mini_engine.train.forward import dense_logits, pad_batch

__all__ = ["FamilyScore", "ask_engine", "ask_recompute", "eval_probes", "score"]

_TOKENIZER = ByteTokenizer()


@dataclass(frozen=True)
class FamilyScore:
    family: str
    correct: int
    total: int
    wrong: tuple[tuple[str, str, str], ...]  # (probe id, expected, output) of the first few misses

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")

    def as_dict(self) -> dict:
        return {"family": self.family, "correct": self.correct, "total": self.total, "accuracy": self.accuracy,
                "wrong": [list(w) for w in self.wrong]}


def eval_probes(family: str, seed: int, count: int, **settings):
    """``count`` probes of ``family`` at its default settings (or ``settings``); a probe with media is
    a chat user message, as ``hammer probe`` sends it."""
    from probes import Message, generate_probes

    probes = generate_probes(family, seed, count, **settings)
    return [replace(p, prompt=None, messages=(Message("user", p.prompt),)) if p.media else p for p in probes]


def ask_recompute(model: HybridModel, probes: Sequence, *, device: torch.device | str = "cpu") -> list[str]:
    """Greedy outputs (special tokens dropped), all probes in one batch, recomputed from scratch per
    token with the dense training forward."""
    stops = set(_TOKENIZER.eos_token_ids)
    seqs = [_TOKENIZER.encode(p.text) for p in probes]
    media = [media_rows([i for i, t in enumerate(ids) if t == _TOKENIZER.media_token_id], p.media, device)
             for p, ids in zip(probes, seqs)]
    outputs: list[list[int]] = [[] for _ in probes]
    live = list(range(len(probes)))
    was_training = model.training
    model.eval()
    with torch.no_grad(), inv.relaxed():
        for _ in range(max((p.max_tokens for p in probes), default=0)):
            live = [i for i in live if len(outputs[i]) < probes[i].max_tokens
                    and not (outputs[i] and outputs[i][-1] in stops)]
            if not live:
                break
            rows = [seqs[i] + outputs[i] for i in live]
            logits = dense_logits(model, pad_batch([torch.tensor(r, device=device) for r in rows]),
                                  [media[i] for i in live])
            last = logits[torch.arange(len(rows), device=logits.device),
                          torch.tensor([len(r) - 1 for r in rows], device=logits.device)]
            for i, token in zip(live, last.argmax(-1).tolist()):
                outputs[i].append(token)
    model.train(was_training)
    return [_TOKENIZER.decode(o, skip_special=True) for o in outputs]


def ask_engine(model: HybridModel, probes: Sequence) -> list[str]:
    """Greedy outputs from an engine with the prefix cache off, one request at a time."""
    from mini_engine.engine import Engine, EngineConfig, SamplingParams

    engine = Engine(EngineConfig(enable_cache=False, max_running=1, num_slots=8), model=model)
    texts = []
    for probe in probes:
        params = SamplingParams(max_tokens=probe.max_tokens, stop_token_ids=_TOKENIZER.eos_token_ids)
        rid = engine.submit(probe.text, params, media=list(probe.media))
        engine.run()
        texts.append(_TOKENIZER.decode(engine.result(rid).output_ids, skip_special=True))
    return texts


def score(family: str, probes: Sequence, outputs: Sequence[str], keep_wrong: int = 5) -> FamilyScore:
    wrong = [(p.id, p.expected, out) for p, out in zip(probes, outputs) if not p.is_correct(out)]
    return FamilyScore(family, len(probes) - len(wrong), len(probes), tuple(wrong[:keep_wrong]))
