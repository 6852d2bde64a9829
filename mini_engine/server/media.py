"""Media in OpenAI content parts: ``image_url`` data URLs and ``input_media`` base64, decoded and bounded.

Each media part of a message becomes one ``<|media|>`` placeholder in the prompt text, at its
position, and its decoded bytes join the submission's ``media`` in the same order.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from mini_engine.model.tokenizer import MEDIA_TOKEN
from mini_engine.server.errors import APIError

__all__ = ["content_text"]

PART_TYPES = ("text", "image_url", "input_media")


def content_text(content: str | list[dict[str, Any]], where: str, max_media_bytes: int) -> tuple[str, list[bytes]]:
    """A message's text with one placeholder per media part, and the parts' bytes in order.

    ``where`` names the content field (``messages[2].content``) so errors point at the exact part.
    """
    if isinstance(content, str):
        return content, []
    pieces, media = [], []
    for j, part in enumerate(content):
        path, kind = f"{where}[{j}]", part.get("type")
        if kind == "text":
            pieces.append(_string(part.get("text"), f"{path}.text"))
        elif kind in ("image_url", "input_media"):
            payload, field = _media_payload(part, path)
            media.append(decode_media(payload, field, max_media_bytes))
            pieces.append(MEDIA_TOKEN)
        else:
            raise APIError(400, f"{path}.type must be one of {PART_TYPES}; got {kind!r}", param=f"{path}.type")
    return "".join(pieces), media


def _media_payload(part: Mapping[str, Any], path: str) -> tuple[str, str]:
    """The base64 text of a media part and the field it sits in."""
    if part["type"] == "input_media":
        return _string(part.get("data"), f"{path}.data"), f"{path}.data"
    image = part.get("image_url")
    field = f"{path}.image_url.url"
    url = _string(image.get("url") if isinstance(image, dict) else None, field)
    header, sep, payload = url.partition(",")
    if not (header.startswith("data:") and header.endswith(";base64") and sep):
        raise APIError(400, f"{field} must be a data URL (data:<mime>;base64,<data>); this server fetches "
                            f"nothing from the network", param=field)
    return payload, field


def decode_media(payload: str, field: str, max_bytes: int) -> bytes:
    """Strict base64 of at most ``max_bytes`` decoded bytes (checked before decoding, too)."""
    if len(payload) > 4 * (-(-max_bytes // 3)) + 4:
        raise APIError(400, f"{field} is larger than the {max_bytes}-byte media limit", param=field,
                       code="media_too_large")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{field} is not valid base64", param=field) from None
    if not data:
        raise APIError(400, f"{field} holds no bytes", param=field)
    if len(data) > max_bytes:
        raise APIError(400, f"{field} is {len(data)} bytes; the media limit is {max_bytes}", param=field,
                       code="media_too_large")
    return data


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise APIError(400, f"{field} must be a string; got {type(value).__name__}", param=field)
    return value
