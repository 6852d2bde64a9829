"""The request bodies of the OpenAI API subset we serve, validated by pydantic.

Known fields are strict (a string where an int belongs is refused, naming the field); unknown
fields are ignored, as OpenAI does. Fields whose OpenAI type is a union (``prompt``, ``stop``,
message ``content``) are checked by plain validators, so an error names the field itself rather
than one of pydantic's union branches. Checks that need the engine (vocabulary, context, media
size) happen where the submission is built (``prompts.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

__all__ = ["ChatCompletionRequest", "ChatMessage", "CompletionRequest", "StreamOptions"]

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_SEED = 2**32 - 1

_FIELDS = ConfigDict(strict=True, extra="ignore")


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", message)


class StreamOptions(BaseModel):
    model_config = _FIELDS
    include_usage: bool | None = False


class _GenerationRequest(BaseModel):
    """Fields both endpoints share. ``None`` means "the default", as OpenAI clients may send null."""

    model_config = _FIELDS
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("stop", mode="plain")
    @classmethod
    def _stop_strings(cls, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        strings = [value] if isinstance(value, str) else value
        if (not isinstance(strings, list) or not 0 < len(strings) <= MAX_STOP_STRINGS
                or not all(isinstance(s, str) and s for s in strings)):
            raise _invalid(f"must be a non-empty string or a list of 1 to {MAX_STOP_STRINGS} non-empty strings")
        return tuple(strings)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.stop or ()  # the validator does not run on the default

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> tuple[int | None, str]:
        """The generation budget the client asked for (None: the default) and the field it came from."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int]
    ignore_eos: bool | None = False

    @field_validator("prompt", mode="plain")
    @classmethod
    def _text_or_token_ids(cls, value: Any) -> str | list[int]:
        if isinstance(value, str) and value:
            return value
        if isinstance(value, list) and value and all(type(t) is int for t in value):
            return value
        raise _invalid("must be a non-empty string or a non-empty list of token ids")


class ChatMessage(BaseModel):
    model_config = _FIELDS
    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]

    @field_validator("content", mode="plain")
    @classmethod
    def _text_or_parts(cls, value: Any) -> str | list[dict[str, Any]]:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(part, dict) for part in value):
            return value  # each part is checked where the prompt is built (prompts.content_text)
        raise _invalid("must be a string or a non-empty list of content parts (objects with a 'type')")


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
