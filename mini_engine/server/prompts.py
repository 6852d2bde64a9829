"""From a validated request body to what the engine is asked: prompt ids, media, sampling parameters.

Every check that needs the engine's limits happens here, before anything reaches the engine
thread, so a bad request is a 4xx naming its field and never an exception inside the engine.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from mini_engine.engine import SamplingParams
from mini_engine.model import ByteTokenizer
from mini_engine.model.tokenizer import MEDIA_TOKEN
from mini_engine.server.errors import APIError
from mini_engine.server.media import content_text
from mini_engine.server.protocol import MAX_SEED, ChatCompletionRequest, CompletionRequest

__all__ = ["Limits", "Submission", "chat_submission", "completion_submission"]

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the rest of the context


@dataclass(frozen=True)
class Limits:
    """What a request may ask of this engine (read from its config once, before it starts)."""

    max_context: int
    max_running: int
    vocab_size: int
    max_media_bytes: int


@dataclass(frozen=True)
class Submission:
    prompt: list[int]
    params: SamplingParams
    n: int
    media: tuple[bytes, ...] = ()


def completion_submission(body: CompletionRequest, limits: Limits, tokenizer: ByteTokenizer) -> Submission:
    if isinstance(body.prompt, str):
        ids = tokenizer.encode(body.prompt)
    else:
        ids = body.prompt
        bad = next((t for t in ids if not 0 <= t < limits.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"prompt holds token id {bad}, outside the vocabulary [0, {limits.vocab_size})",
                           param="prompt")
    stop_ids = () if body.ignore_eos else tokenizer.eos_token_ids
    params = _sampling(body, len(ids), "prompt", limits, stop_ids, COMPLETION_DEFAULT_MAX_TOKENS)
    return Submission(ids, params, _choices(body, limits))


def chat_submission(body: ChatCompletionRequest, limits: Limits, tokenizer: ByteTokenizer) -> Submission:
    messages, media = [], []
    for i, message in enumerate(body.messages):
        text, items = content_text(message.content, f"messages[{i}].content", limits.max_media_bytes)
        messages.append({"role": message.role, "content": text})
        media.extend(items)
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages))
    _check_placeholders(ids, len(media), "messages", tokenizer)
    params = _sampling(body, len(ids), "messages", limits, tokenizer.eos_token_ids, None)
    return Submission(ids, params, _choices(body, limits), tuple(media))


def _check_placeholders(ids: list[int], media: int, field: str, tokenizer: ByteTokenizer) -> None:
    """With media, one ``<|media|>`` per media part: the text itself must not spell the placeholder.

    Without media a spelled placeholder is an ordinary token, as in the embedded engine.
    """
    placeholders = ids.count(tokenizer.media_token_id)
    if media and placeholders != media:
        raise APIError(400, f"{field} holds {placeholders} {MEDIA_TOKEN} placeholder(s) for {media} media part(s); "
                            f"leave {MEDIA_TOKEN} out of the text: each media part places its own", param=field)


def _sampling(body: CompletionRequest | ChatCompletionRequest, prompt_len: int, prompt_field: str,
              limits: Limits, stop_ids: tuple[int, ...], default_max_tokens: int | None) -> SamplingParams:
    room = limits.max_context - prompt_len
    if room < 1:
        raise APIError(400, f"{prompt_field} is {prompt_len} tokens; the context holds {limits.max_context} "
                            f"including at least one generated token", param=prompt_field,
                       code="context_length_exceeded")
    max_tokens, field = body.requested_max_tokens()
    if max_tokens is None:
        max_tokens = min(room, default_max_tokens or room)
    if max_tokens > room:
        raise APIError(400, f"{prompt_field} ({prompt_len} tokens) + {field} ({max_tokens}) exceeds the context "
                            f"of {limits.max_context} tokens; lower {field} to at most {room}", param=field,
                       code="context_length_exceeded")
    temperature = body.temperature or 0.0
    # Unseeded sampling is random, as with OpenAI; a seed makes it replayable (and hit-invariant).
    seed = body.seed if body.seed is not None else (secrets.randbelow(MAX_SEED + 1) if temperature else 0)
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, stop_token_ids=tuple(stop_ids),
                          stop=body.stop_strings)


def _choices(body: CompletionRequest | ChatCompletionRequest, limits: Limits) -> int:
    if body.choices > limits.max_running:
        raise APIError(400, f"n={body.choices} is more than this server runs at once (max_running="
                            f"{limits.max_running})", param="n")
    return body.choices
