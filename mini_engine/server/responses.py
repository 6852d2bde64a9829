"""OpenAI response shapes for both endpoints, whole and streamed, plus the ``forensics`` extension.

The two endpoints differ only in names and in how a choice carries its text (``text`` vs a
``message`` / ``delta``); ``Flavor`` holds that difference so every other function serves both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mini_engine.engine import RequestResult

__all__ = ["CHAT", "COMPLETION", "Flavor", "ResponseMeta", "forensics", "usage"]


@dataclass(frozen=True)
class ResponseMeta:
    id: str
    created: int
    model: str


@dataclass(frozen=True)
class Flavor:
    id_prefix: str
    object: str
    chunk_object: str
    chat: bool

    def response(self, meta: ResponseMeta, results: Sequence[RequestResult]) -> dict:
        choices = [self._choice(i, r.text, r.finish_reason) for i, r in enumerate(results)]
        return {**self._head(meta, self.object), "choices": choices, "usage": usage(results),
                "forensics": forensics(results)}

    def chunk(self, meta: ResponseMeta, index: int, text: str | None, finish_reason: str | None) -> dict:
        """One streamed choice delta; for chat, ``text=None`` is the opening delta naming the role."""
        if not self.chat:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        else:
            delta = {"role": "assistant", "content": ""} if text is None else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head(meta, self.chunk_object), "choices": [choice]}

    def usage_chunk(self, meta: ResponseMeta, results: Sequence[RequestResult]) -> dict:
        return {**self._head(meta, self.chunk_object), "choices": [], "usage": usage(results)}

    def _choice(self, index: int, text: str, finish_reason: str | None) -> dict:
        if self.chat:
            body = {"message": {"role": "assistant", "content": text}}
        else:
            body = {"text": text}
        return {"index": index, **body, "logprobs": None, "finish_reason": finish_reason}

    @staticmethod
    def _head(meta: ResponseMeta, object_: str) -> dict:
        return {"id": meta.id, "object": object_, "created": meta.created, "model": meta.model}


COMPLETION = Flavor("cmpl", "text_completion", "text_completion", chat=False)
CHAT = Flavor("chatcmpl", "chat.completion", "chat.completion.chunk", chat=True)


def usage(results: Sequence[RequestResult]) -> dict:
    """The prompt counts once (the choices share it); completion tokens add up over the choices."""
    first = results[0]
    completion = sum(len(r.output_ids) for r in results)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens}}


def forensics(results: Sequence[RequestResult]) -> dict:
    """Per choice: what the cache was asked (key), what it answered (restored slot, cached tokens), and with a
    ledger kept, the checks of the logits each token was sampled from."""
    return {"choices": [_forensic_choice(i, r) for i, r in enumerate(results)]}


def _forensic_choice(index: int, result: RequestResult) -> dict:
    fields = {"index": index, "request_id": result.rid, "cache_key": result.cache_key,
              "restored_slot": result.restored_slot, "cached_tokens": result.cached_tokens}
    if result.media_digest is not None:
        fields["media_digest"] = result.media_digest
    if result.logits_digest is not None:  # an instrumented engine (``serve --ledger``): the logits behind each token
        fields["logits_digest"] = result.logits_digest
        fields["logit_checks"] = list(result.logit_checks)
    return fields
