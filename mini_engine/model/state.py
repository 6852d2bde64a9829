"""What a sequence carries between forward calls, and the snapshots a forward emits.

The engine's pools hold exactly these tensors, slot by slot; this module is the model-level view.

GDN state is kept *chunk-exact*: ``rec`` is the recurrent state at the last 64-token boundary
(``boundary = length // 64 * 64``) and ``pending`` holds the prepared q|k|v|g|beta rows of the
tokens since then. Each forward recomputes the current chunk from ``rec``, so a token's output —
and every boundary state — is computed by the same fixed-shape arithmetic whether it came from a
long prefill, a short continuation or a decode step (DESIGN.md §3, "Exactness")::

    positions  0 ............ 64 ............ 128 ...... length
               |-- chunk 0 ---|--- chunk 1 ---|-- pending --|
    rec = state at 128 ---------------------^
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mini_engine.model.config import SNAPSHOT_ALIGN, ModelConfig

__all__ = ["STATE_CHECKSUM_FORMAT", "SequenceState", "Snapshot", "pending_width", "state_bytes"]


def pending_width(config: ModelConfig) -> int:
    """Row width of the pending buffer: q and k (per key head), v, g and beta (per value head)."""
    return 2 * config.linear_key_dim + config.linear_value_dim + 2 * config.linear_num_value_heads


# What the engine's state checksums are (the ledger's ``checksum_format`` row): ``ops.checksum``'s two-lane hash32
# of ``state_bytes``. Change it with either, so that no ledger compares its checksums with an older build's.
STATE_CHECKSUM_FORMAT = "hash32x2:conv|rec|rows-by-token"


def state_bytes(conv: torch.Tensor, rec: torch.Tensor, pending: torch.Tensor) -> torch.Tensor:
    """The bytes that define a state, in the order its checksum reads them: conv, rec, then the pending rows
    in token order, each row all layers (``pending`` [L_linear, rows, width] read as [rows, L_linear, width]).
    In this order a new token's row appends: the words before it keep their places (``ops.checksum.memo``)."""
    return torch.cat([conv.reshape(-1), rec.reshape(-1), pending.transpose(0, 1).reshape(-1)])


@dataclass
class SequenceState:
    """The full cache of one sequence after ``length`` tokens (conv and rec per linear layer, KV per full layer)."""

    length: int
    conv: torch.Tensor  # [L_linear, conv_dim, W - 1]: the last W - 1 conv inputs
    rec: torch.Tensor  # [L_linear, Hv, K, V]: recurrent state at boundary()
    pending: torch.Tensor  # [L_linear, length - boundary(), pending_width]
    keys: torch.Tensor  # [L_full, length, Hkv, D] (after RoPE)
    values: torch.Tensor  # [L_full, length, Hkv, D]

    @classmethod
    def empty(cls, config: ModelConfig, device: torch.device | str = "cpu") -> SequenceState:
        n_lin, n_full = len(config.linear_layers), len(config.full_layers)
        return cls(
            length=0,
            conv=torch.zeros(n_lin, config.conv_dim, config.linear_conv_kernel_dim - 1, device=device),
            rec=torch.zeros(n_lin, config.linear_num_value_heads, config.linear_key_head_dim,
                            config.linear_value_head_dim, device=device),
            pending=torch.zeros(n_lin, 0, pending_width(config), device=device),
            keys=torch.zeros(n_full, 0, config.num_key_value_heads, config.head_dim, device=device),
            values=torch.zeros(n_full, 0, config.num_key_value_heads, config.head_dim, device=device),
        )

    def boundary(self) -> int:
        return self.length // SNAPSHOT_ALIGN * SNAPSHOT_ALIGN

    def check(self) -> None:
        """Raise if the tensors disagree with ``length`` (a precise message, never a silent mismatch)."""
        expect_pending = self.length - self.boundary()
        if self.pending.shape[1] != expect_pending:
            raise ValueError(f"state of length {self.length} must hold {expect_pending} pending rows; "
                             f"holds {self.pending.shape[1]}")
        for name in ("keys", "values"):
            if getattr(self, name).shape[1] != self.length:
                raise ValueError(f"state of length {self.length} holds {getattr(self, name).shape[1]} {name}")

    @classmethod
    def from_snapshot(cls, config: ModelConfig, snapshot: Snapshot, keys: torch.Tensor,
                      values: torch.Tensor) -> SequenceState:
        """Resume at a snapshot's boundary, with the KV of (at least) its first ``snapshot.position`` tokens."""
        n_lin = snapshot.rec.shape[0]
        return cls(snapshot.position, snapshot.conv.clone(), snapshot.rec.clone(),
                   snapshot.rec.new_zeros(n_lin, 0, pending_width(config)),
                   keys[:, : snapshot.position].clone(), values[:, : snapshot.position].clone())


@dataclass(frozen=True)
class Snapshot:
    """Linear-layer state at a 64-token boundary: what a track snapshot slot holds."""

    position: int
    conv: torch.Tensor  # [L_linear, conv_dim, W - 1]
    rec: torch.Tensor  # [L_linear, Hv, K, V]
