"""The small pieces of a Qwen3.5 decoder layer: RMSNorms, SwiGLU MLP and partial RoPE.

Parameters live in ``nn.Module``s named as in Hugging Face's implementation (so checkpoints map one
to one); the arithmetic goes through ``mini_engine.ops.invariant`` so that it is batch-invariant.
"""

from __future__ import annotations

import torch
from torch import nn

from mini_engine.constants import SWIGLU_BLOCK
from mini_engine.model import kernels as ops
from mini_engine.model.config import ModelConfig
from mini_engine.ops import invariant as inv

__all__ = ["FusedProjection", "OffsetRMSNorm", "GatedRMSNorm", "SwiGLU", "Rotary", "new_linear"]


def new_linear(n_in: int, n_out: int) -> nn.Linear:
    """A bias-free weight holder; forward passes call ``inv.linear`` on its ``weight``."""
    return nn.Linear(n_in, n_out, bias=False)


class FusedProjection:
    """Projections that read the same rows, as one weight: theirs concatenated by output rows (in the order
    given), so one gemm computes them all (the Triton prefill's and the decode step's). The Triton prefill gemm
    picks its tiles by the weight's dtype and input width alone and reduces each output over K in one fixed
    order, so a projection's columns of the fused result are the bits of its own gemm. (``inv.linear`` makes no
    such promise, and the reference forward does not fuse.)

    The concatenation is a copy, made on first use and again whenever a part's weight changes: a new tensor,
    dtype or device, or an in-place write to the parameter (``load_state_dict``, an optimizer step). A write
    through ``.data`` bypasses torch's version counter and is not seen. Not an ``nn.Module``: it holds no
    parameter of its own, so state dicts and checkpoints do not see it.

    ``block``: two parts of one width (a multiple of ``block``) taken ``block`` rows at a time, the first's then the
    second's (the MLP's gate | up: ``silu_mul(block=)`` reads such an output, and a gemm tile of ``2 * block`` weight
    rows then holds a block of both, so the gemm's own launch can apply the activation: ``decode_rows.gemm.swiglu``).
    A column's bits are its row's, wherever the row sits."""

    def __init__(self, *parts: nn.Linear, block: int | None = None) -> None:
        widths = [p.weight.shape[0] for p in parts]
        if block is not None and (len(parts) != 2 or widths[0] != widths[1] or block <= 0 or widths[0] % block):
            raise ValueError(f"FusedProjection(block={block}) interleaves two parts of one width, a multiple of "
                             f"block; got widths {widths}")
        self.parts, self.block = parts, block
        self._key: tuple | None = None
        self._weight: torch.Tensor | None = None

    @property
    def widths(self) -> list[int]:
        """Each part's output width, in order: how to split the fused result (without ``block``)."""
        return [p.weight.shape[0] for p in self.parts]

    def weight(self) -> torch.Tensor:
        key = tuple((p.weight.data_ptr(), p.weight._version, p.weight.dtype, p.weight.device) for p in self.parts)
        if key != self._key:
            parts = [p.weight.detach() for p in self.parts]
            if self.block is None:
                self._weight = torch.cat(parts)
            else:  # [n // block, 2, block, K]: block i of the first part, then block i of the second
                self._weight = torch.stack([w.unflatten(0, (-1, self.block)) for w in parts], 1).flatten(0, 2)
            self._key = key
        return self._weight


class OffsetRMSNorm(nn.Module):
    """RMSNorm scaled by ``(1 + weight)``: zero weights are the identity scale (Qwen3.5 convention)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return inv.rms_norm(x, self.eps) * (1.0 + self.weight)


class GatedRMSNorm(nn.Module):
    """``weight * rmsnorm(x) * silu(gate)``: the GDN output norm (plain weight, no offset)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.weight * inv.rms_norm(x, self.eps) * inv.silu(gate)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = new_linear(hidden, intermediate)
        self.up_proj = new_linear(hidden, intermediate)
        self.down_proj = new_linear(intermediate, hidden)
        # gate and up a block of rows at a time where the width allows (a decode gemm's tile then holds both)
        self.gate_up = FusedProjection(self.gate_proj, self.up_proj,
                                       block=SWIGLU_BLOCK if intermediate % SWIGLU_BLOCK == 0 else None)

    def forward(self, x: torch.Tensor, kernels: str = "reference") -> torch.Tensor:
        """``kernels``: the projections' implementation (``mini_engine.model.kernels``); "triton" computes gate
        and up in one gemm (``gate_up``) and SiLU(gate) * up in one row kernel (the decode step's)."""
        if kernels == "triton":
            from mini_engine.ops.decode_rows.triton import silu_mul

            hidden = silu_mul(gate_up=ops.linear(kernels, x, self.gate_up.weight()), out_dtype=torch.float32,
                              block=self.gate_up.block)
        else:
            gate, up = ops.linear(kernels, x, self.gate_proj.weight), ops.linear(kernels, x, self.up_proj.weight)
            hidden = inv.silu(gate) * up
        return ops.linear(kernels, hidden, self.down_proj.weight)


class Rotary:
    """Rotate-half RoPE on the first ``rotary_dim`` channels of each head; the rest pass through."""

    def __init__(self, config: ModelConfig) -> None:
        dim = config.rotary_dim
        self.dim = dim
        self.inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self._on_device = {self.inv_freq.device: self.inv_freq}

    def frequencies(self, device: torch.device) -> torch.Tensor:
        """``inv_freq`` on ``device``, copied there once (a CUDA graph's capture may not copy from the host)."""
        if device not in self._on_device:
            self._on_device[device] = self.inv_freq.to(device)
        return self._on_device[device]

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [N, heads, head_dim]; positions: [N] absolute positions."""
        return inv.rope(x, positions, self.frequencies(positions.device))
