"""Training data drawn from the probe families themselves, in the form the harness sends them.

Each ``Example`` is one token sequence with the answer tokens marked: the label of the position
before an answer token is that token, and the label of an answer's last token is the token that
ends a reply (``<|endoftext|>`` after a completion, ``<|im_end|>`` in a chat). Everything else is
context, weighted by the recipe's language-model weight.

The generators call the families' own question makers with *training* seeds (``train/...`` ids),
so the probes a harness run asks (its ids come from other seeds) are never in the training set;
the contexts they wrap those questions in are the ones the patterns build: the calculator
preamble, a chain of follow-up questions, filler text in front (chunk boundaries), chat turns.
Settings are drawn around each family's defaults (haystacks from 32 to 1,152 tokens, 1-5 facts).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mini_engine.model.media import media_features
from mini_engine.model.tokenizer import ByteTokenizer

__all__ = ["Example", "FAMILY_MAKERS", "IGNORE", "Segment", "build_example", "collate", "draw_examples", "media_rows"]

IGNORE = -100
_TOKENIZER = ByteTokenizer()
ENDOFTEXT, IM_END = _TOKENIZER.eos_token_ids


@dataclass(frozen=True)
class Example:
    family: str
    ids: tuple[int, ...]
    answer_labels: tuple[int, ...]  # per position: the answer token that must follow, or IGNORE
    media: tuple[tuple[int, bytes], ...] = ()  # (position of a <|media|> token, the item)


@dataclass(frozen=True)
class Segment:
    """A piece of text; an answer's tokens (and then ``end``) are what the model is trained to emit."""

    text: str
    answer: bool = False
    end: int | None = None  # the reply-ending token after an answer (not part of the input)


def build_example(family: str, segments: Sequence[Segment], media: Sequence[bytes] = ()) -> Example:
    """Tokens and answer labels of ``segments``, in order; one media item per ``<|media|>`` token."""
    ids: list[int] = []
    labels: list[int] = []
    for segment in segments:
        piece = _TOKENIZER.encode(segment.text)
        if not segment.answer:
            ids += piece
            labels += [IGNORE] * len(piece)
            continue
        if not ids or not piece:
            raise ValueError(f"{family}: an answer needs context before it and at least one token")
        targets = piece + ([segment.end] if segment.end is not None else [])
        labels[-1] = targets[0]  # the position before the answer predicts its first token
        ids += piece
        labels += targets[1:] + ([IGNORE] if segment.end is None else [])
    positions = [i for i, token in enumerate(ids) if token == _TOKENIZER.media_token_id]
    if len(positions) != len(media):
        raise ValueError(f"{family}: {len(positions)} media tokens but {len(media)} media items")
    return Example(family, tuple(ids), tuple(labels), tuple(zip(positions, media)))


def _chat(turns: Sequence[tuple[str, str]], *, answers: Sequence[bool]) -> list[Segment]:
    """ChatML segments of (role, content) turns; assistant turns flagged in ``answers`` are trained."""
    segments = []
    for (role, content), trained in zip(turns, answers):
        segments.append(Segment(f"<|im_start|>{role}\n"))
        if trained:
            segments.append(Segment(content, answer=True, end=IM_END))
            segments.append(Segment("<|im_end|>\n"))
        else:
            segments.append(Segment(f"{content}<|im_end|>\n"))
    return segments


def _user_chat(body: str, answer: str) -> list[Segment]:
    """``body`` as one user message and ``answer`` as the trained assistant reply."""
    return _chat([("user", body), ("assistant", answer)], answers=[False, True])


def _arithmetic(rng: random.Random, seed: int) -> Example:
    from probes.families.arithmetic import PREAMBLE, question
    from probes.families.needle import filler

    def ask(i: int) -> tuple[str, str]:
        digits = rng.choices((1, 2, 3), weights=(1, 2, 7))[0]
        return question(f"train/arithmetic/{seed}/{i}", digits, ("+", "-"))

    style = rng.choices(("preamble", "filler", "chat"), weights=(6, 3, 1))[0]
    if style == "chat":
        text, answer = ask(0)
        front = PREAMBLE if rng.random() < 0.5 else filler(rng.randint(0, 400), rng.getrandbits(31)) + "\n"
        return build_example("arithmetic", _user_chat(front + text, answer))
    if style == "filler":
        segments = [Segment(filler(rng.randint(0, 700), rng.getrandbits(31)) + "\n")]
    else:
        segments = [Segment(PREAMBLE)]
    # A follow-up chain: each answer, a new line, the next question. Long chains carry many questions
    # in one sequence (the batch's length is set by the needle haystacks anyway, so they cost little).
    chain = rng.randint(1, 4) if rng.random() < 0.3 else rng.randint(8, 24)
    for i in range(chain):
        text, answer = ask(i)
        segments += [Segment(("" if i == 0 else "\n") + text), Segment(" " + answer, answer=True, end=ENDOFTEXT)]
    return build_example("arithmetic", segments)


def _needle(rng: random.Random, seed: int) -> Example:
    from probes.families.needle import generate

    length = 512 if rng.random() < 0.2 else rng.randint(32, 1152)
    (probe,) = generate(seed, 1, haystack_tokens=length, depths=(rng.random(),), haystack_seed=rng.getrandbits(31))
    if rng.random() < 0.1:
        return build_example("needle", _user_chat(probe.prompt, probe.expected))
    return build_example("needle", [Segment(probe.prompt), Segment(" " + probe.expected, answer=True, end=ENDOFTEXT)])


def _recall(rng: random.Random, seed: int) -> Example:
    from probes.families.recall import generate

    facts = rng.randint(1, 5)
    probes = generate(seed, facts, facts=facts, filler_turns=rng.randint(0, 4))
    last = probes[-1]
    turns = [(m.role, m.content) for m in last.messages] + [("assistant", last.expected)]
    # The replies to the questions (the user turns that asked for a fact) are the trained ones.
    asked = {p.messages[-1].content for p in probes}
    answers = [role == "assistant" and i > 0 and turns[i - 1][1] in asked for i, (role, _) in enumerate(turns)]
    return build_example("recall", _chat(turns, answers=answers))


def _media(rng: random.Random, seed: int) -> Example:
    from probes.families.media import generate

    attribute = rng.choice(("color", "shape"))
    probe = generate(seed, 2, attributes=(attribute,))[rng.randint(0, 1)]
    if rng.random() < 0.8:  # as the harness sends a probe with media: one user message
        return build_example("media", _user_chat(probe.prompt, probe.expected), probe.media)
    segments = [Segment(probe.prompt), Segment(" " + probe.expected, answer=True, end=ENDOFTEXT)]
    return build_example("media", segments, probe.media)


FAMILY_MAKERS: dict[str, Callable[[random.Random, int], Example]] = {
    "arithmetic": _arithmetic, "needle": _needle, "recall": _recall, "media": _media}


def draw_examples(mix: dict[str, int], seed: int, step: int) -> list[Example]:
    """The examples of one training step: ``mix[family]`` of each, a pure function of (seed, step)."""
    unknown = sorted(set(mix) - set(FAMILY_MAKERS))
    if unknown:
        raise ValueError(f"unknown families in the mix: {unknown}; known: {sorted(FAMILY_MAKERS)}")
    examples = []
    for family, count in sorted(mix.items()):
        for i in range(count):
            example_seed = (seed * 1_000_003 + step) * 64 + i
            rng = random.Random(f"{family}/{example_seed}")
            examples.append(FAMILY_MAKERS[family](rng, example_seed))
    return examples


def collate(examples: Sequence[Example], device: torch.device | str = "cpu"):
    """(tokens [B, T] right-padded, media rows per sequence, answer labels [B, T], next-token labels
    [B, T]); padding positions are labelled IGNORE."""
    def padded(rows: list[list[int]], value: int) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([r + [value] * (width - len(r)) for r in rows], device=device)

    tokens = padded([list(e.ids) for e in examples], 0)
    answer = padded([list(e.answer_labels) for e in examples], IGNORE)
    following = padded([list(e.ids[1:]) + [IGNORE] for e in examples], IGNORE)
    media = [media_rows([p for p, _ in e.media], [item for _, item in e.media], device) for e in examples]
    return tokens, media, answer, following


def media_rows(positions: Sequence[int], items: Sequence[bytes], device: torch.device | str = "cpu"):
    """The model's media entry of one sequence (placeholder rows, their features), or None without media."""
    if not items:
        return None
    return (torch.tensor(list(positions), device=device), torch.stack([media_features(m) for m in items]).to(device))
