"""How the gated delta rule's Triton kernels are launched and what they accept: the head sizes, the state-walk
launch configuration, the slot-pool layout. Shared by the prefill (``triton.py``) and decode
(``triton_decode.py``) kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["HEAD_SIZES", "LaunchConfig", "check_head_sizes", "check_pool", "check_running", "v_tiles"]

HEAD_SIZES = (16, 32, 64, 128)  # powers of two for tl.arange, >= 16 for tl.dot; 256 would overflow shared memory


@dataclass(frozen=True)
class LaunchConfig:
    """How a state-walking kernel is launched: the V tile per program, warps and pipeline stages."""

    block_v: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        if self.block_v not in HEAD_SIZES:
            raise ValueError(f"block_v must be one of {HEAD_SIZES}; got {self.block_v}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16; got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be at least 1; got {self.num_stages}")


def check_head_sizes(k_dim: int, v_dim: int, dtype: torch.dtype) -> None:
    for name, size in (("K", k_dim), ("V", v_dim)):
        if size not in HEAD_SIZES:
            raise ValueError(f"the Triton kernels need head size {name} in {HEAD_SIZES}; got {size}")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"q, k and v must be float32, float16 or bfloat16; got {dtype}")


def check_pool(state_pool, state_indices, n_seq: int, state_shape: tuple) -> None:
    """A pool is [slots, Hv, K, V] with each slot contiguous; slots may be strided (one layer of [S, L, ...])."""
    _, k_dim, v_dim = state_shape
    if state_pool.dim() != 4 or tuple(state_pool.shape[1:]) != state_shape \
            or state_pool.stride()[1:] != (k_dim * v_dim, v_dim, 1):
        raise ValueError(f"state_pool must be [slots, {', '.join(map(str, state_shape))}] with contiguous slots; "
                         f"got shape {tuple(state_pool.shape)}, strides {state_pool.stride()}")
    if state_indices is None or tuple(state_indices.shape) != (n_seq,):
        shape = None if state_indices is None else tuple(state_indices.shape)
        raise ValueError(f"state_indices must be [{n_seq}] (one pool row per sequence); got {shape}")


def check_running(rec_pool, run_pool, run_rows) -> bool:
    """Whether a decode step keeps a running copy of the state: ``run_pool`` laid out exactly as ``rec_pool`` (a kernel
    reads both at one slot offset) with ``run_rows`` [slots, 2] int32 beside it (its row count, by parity), or
    neither."""
    if (run_pool is None) != (run_rows is None):
        raise ValueError("run_pool and run_rows go together: pass both or neither")
    if run_pool is not None and (run_pool.shape != rec_pool.shape or run_pool.stride() != rec_pool.stride()
                                 or tuple(run_rows.shape) != (rec_pool.shape[0], 2) or run_rows.stride(1) != 1
                                 or run_rows.dtype != torch.int32):
        raise ValueError(f"run_pool must be laid out as rec_pool {tuple(rec_pool.shape)} (strides {rec_pool.stride()}) "
                         f"and run_rows int32 [{rec_pool.shape[0]}, 2] with contiguous pairs; got "
                         f"{tuple(run_pool.shape)}, strides {run_pool.stride()}, {run_rows.dtype} "
                         f"{tuple(run_rows.shape)}, strides {run_rows.stride()}")
    return run_pool is not None


def v_tiles(config: LaunchConfig, v_dim: int) -> int:
    if config.block_v > v_dim:
        raise ValueError(f"config.block_v={config.block_v} is wider than the value head (V={v_dim})")
    return v_dim // config.block_v
