"""A tiny media projection: media bytes -> one embedding that replaces a ``<|media|>`` placeholder.

Real multimodal models run a vision tower; what the cache has to get right is the same either way:
the placeholder's embedding depends on the media, not on the token, so two prompts with identical
tokens and different media must never share a cached prefix. Here a media item is a byte string,
folded into ``MEDIA_FEATURES`` numbers (byte ``j`` lands in bucket ``j % 64``; each bucket is the
mean of its bytes scaled to [-1, 1]; items up to 64 bytes are represented exactly) and RMS-normalised
and projected to the hidden size by one linear map, trained or seeded.
"""

from __future__ import annotations

import torch
from torch import nn

from mini_engine.ops import invariant as inv

__all__ = ["MEDIA_FEATURES", "MediaProjector", "media_features"]

MEDIA_FEATURES = 64
_SEED = 4099  # the projector of a checkpoint without one is seeded, so every machine builds the same


def media_features(data: bytes) -> torch.Tensor:
    """``[MEDIA_FEATURES]`` float32 features of one media item (empty media: all zeros)."""
    values = torch.tensor(list(data), dtype=torch.float32) / 127.5 - 1.0
    buckets = torch.arange(len(data)) % MEDIA_FEATURES
    sums = torch.zeros(MEDIA_FEATURES).index_add_(0, buckets, values)
    counts = torch.zeros(MEDIA_FEATURES).index_add_(0, buckets, torch.ones(len(data)))
    return sums / counts.clamp(min=1.0)


class MediaProjector(nn.Module):
    """``features [n, 64] -> embeddings [n, hidden]``; its weight is seeded at construction."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(_SEED)
        self.weight = nn.Parameter(torch.randn(hidden_size, MEDIA_FEATURES, generator=gen) * MEDIA_FEATURES ** -0.5)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        # Normalised first, so a short item weighs as much as a token embedding (unit scale).
        return inv.linear(inv.rms_norm(features, 1e-6), self.weight)
