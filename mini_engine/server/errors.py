"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}``, raised anywhere, shaped once."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["APIError", "error_body", "param_from_loc"]


class APIError(Exception):
    """A request the server refuses (4xx) or cannot serve (5xx); ``param`` names the offending field."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict:
        return error_body(self.message, param=self.param, code=self.code, type_=self.type)


def error_body(message: str, *, param: str | None = None, code: str | None = None,
               type_: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def param_from_loc(loc: Sequence[str | int]) -> str | None:
    """``("body", "messages", 0, "role")`` -> ``"messages[0].role"``; None for the body as a whole."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    if not parts or not isinstance(parts[0], str):
        return None  # the body itself (not an object) or a JSON decode position
    name = parts[0]
    for part in parts[1:]:
        name += f"[{part}]" if isinstance(part, int) else f".{part}"
    return name
