"""``ops.launch.Launcher``: a kernel's launches through the JIT until a key has compiled, then its compiled kernel
(on a GPU: ``tests/gpu/test_kernels_gpu.py``'s witnessed copies); here, in the interpreter, every launch through
the JIT, and the kernels it refuses."""

import pytest
import torch
import triton
import triton.language as tl

from mini_engine.ops.launch import Launcher


@triton.jit
def _scaled_add(x_ptr, out_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr = 16):
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = k < n
    tl.store(out_ptr + k, tl.load(out_ptr + k, mask=ok) + SCALE * tl.load(x_ptr + k, mask=ok), mask=ok)


@triton.jit
def _constexpr_first(SCALE: tl.constexpr, out_ptr):
    tl.store(out_ptr, SCALE)


def test_the_interpreter_runs_every_launch_through_the_jit():
    """Each launch computes (a default constexpr left out too); with no compiled kernel to keep, no key is kept."""
    launch = Launcher(_scaled_add)
    x, out = torch.arange(40, dtype=torch.float32), torch.zeros(40)
    for _ in range(2):
        launch((3,), "key", (x, out, 40), {"SCALE": 2})
    launch((3,), "key", (x, out, 20), {"SCALE": 1, "BLOCK": 8})
    assert torch.equal(out, 4 * x + torch.where(torch.arange(40) < 20, x, 0)) and launch.keys == []


def test_a_launcher_refuses_what_it_cannot_launch_compiled():
    with pytest.raises(ValueError, match="passes constexprs last"):
        Launcher(_constexpr_first)
    with pytest.raises(ValueError, match="2 arguments for its 3 parameters that are not constexprs"):
        Launcher(_scaled_add)((1,), "key", (torch.zeros(4), torch.zeros(4)), {"SCALE": 1})
