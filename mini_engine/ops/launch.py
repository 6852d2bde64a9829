"""Launching a Triton kernel from a call site whose arguments' specialisation never changes: the JIT once, then the
compiled kernel's own launcher.

``kernel[grid](*args)`` binds the arguments, works out their specialisation (an int equal to 1 or divisible by
16, a pointer on a 16-byte boundary: ``native_specialize_impl``), builds the cache key and looks the compiled
kernel up, every launch: 20.3 us of host time on an H100 (triton 3.6) for the ledger's copy kernel, against
9.1 us through the compiled kernel (``benchmarks/triton_launch_cost.py``). The ledger launches it hundreds of times
a run from a host-bound engine.

    copy = Launcher(_copy_kernel)
    copy(grid, key, args, constexprs)   # the first launch of each key through the JIT, the next ones compiled

The caller vouches that ``key`` settles everything Triton would specialise on for ``args``: the same key, the same
compiled kernel. A call site with its pools fixed (their pointers and strides: ``StateCopier``, ``StateDigester``)
keys on what varies (its constexprs; a pointer it allocates is on a 16-byte boundary; one that varies is marked
``do_not_specialize_on_alignment`` in its kernel); one with nothing fixed keys on all of it (``row_digests``).
Where the JIT returns no compiled kernel (the interpreter, ``TRITON_INTERPRET=1``), every launch goes through it.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Sequence
from typing import Any

from triton.compiler import CompiledKernel

__all__ = ["Launcher"]


class Launcher:
    """One Triton kernel's launches, through its compiled kernel once a key has been launched (module docstring).
    The kernel's constexpr parameters must come after all its other parameters (their values are passed last)."""

    __slots__ = ("_compiled", "_constexprs", "_runtime", "kernel")

    def __init__(self, kernel) -> None:
        params = inspect.signature(kernel.fn).parameters.values()  # (the JIT's and the interpreter's kernels alike)
        constexpr = ["constexpr" in str(p.annotation) for p in params]
        if any(constexpr[i] and not constexpr[i + 1] for i in range(len(constexpr) - 1)):
            raise ValueError(f"{kernel.fn.__name__}: a Launcher passes constexprs last; its parameters mix them with "
                             "the others")
        self.kernel = kernel
        self._runtime = len(constexpr) - sum(constexpr)
        self._constexprs = [(p.name, p.default) for p, c in zip(params, constexpr) if c]
        self._compiled: dict[Hashable, tuple[CompiledKernel, tuple]] = {}

    @property
    def keys(self) -> list[Hashable]:
        """The keys launched through their compiled kernel from now on."""
        return list(self._compiled)

    def __call__(self, grid: tuple[int, ...], key: Hashable, args: Sequence[Any], constexprs: dict[str, Any]) -> None:
        known = self._compiled.get(key)
        if known is not None:
            compiled, tail = known
            compiled[(*grid, 1, 1)[:3]](*args, *tail)
            return
        if len(args) != self._runtime:
            raise ValueError(f"{self.kernel.fn.__name__}: {len(args)} arguments for its {self._runtime} parameters "
                             "that are not constexprs")
        compiled = self.kernel[grid](*args, **constexprs)
        if isinstance(compiled, CompiledKernel):
            self._compiled[key] = (compiled, tuple(constexprs.get(name, default) for name, default in self._constexprs))
