"""A packed forward batch: the new tokens of several sequences, concatenated, with their offsets."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch

from mini_engine.device import upload

__all__ = ["PackedBatch"]


@dataclass(frozen=True)
class PackedBatch:
    starts: tuple[int, ...]  # absolute position of each sequence's first new token
    lengths: tuple[int, ...]  # new tokens per sequence (>= 1)
    _uploaded: dict = field(default_factory=dict, init=False, compare=False, repr=False)  # (name, device) -> tensor

    def __post_init__(self) -> None:
        if len(self.starts) != len(self.lengths):
            raise ValueError(f"{len(self.starts)} starts but {len(self.lengths)} lengths")
        for i, (start, n) in enumerate(zip(self.starts, self.lengths)):
            if start < 0 or n < 1:
                raise ValueError(f"sequence {i}: start must be >= 0 and length >= 1; got start={start}, length={n}")

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def cu_seqlens(self) -> torch.Tensor:
        return torch.tensor([0, *accumulate(self.lengths)])

    @property
    def positions(self) -> torch.Tensor:
        return torch.cat([torch.arange(s, s + n) for s, n in zip(self.starts, self.lengths)])

    def positions_on(self, device: torch.device) -> torch.Tensor:
        """``positions`` on ``device``, uploaded once for the batch (every attention layer of a forward reads them)."""
        return self._on("positions", device)

    def cu_seqlens_on(self, device: torch.device) -> torch.Tensor:
        """``cu_seqlens`` on ``device``, uploaded once for the batch (every conv and attention layer of a Triton
        forward reads them: 24 uploads of the same offsets a 0.8B forward before)."""
        return self._on("cu_seqlens", device)

    def _on(self, name: str, device: torch.device) -> torch.Tensor:
        key = (name, torch.device(device))
        if key not in self._uploaded:
            self._uploaded[key] = upload(getattr(self, name), device)
        return self._uploaded[key]

    def rows(self, i: int) -> slice:
        lo = sum(self.lengths[:i])
        return slice(lo, lo + self.lengths[i])
