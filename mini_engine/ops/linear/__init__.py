"""Projections (``x @ weight.T``) whose row results do not depend on the batch: ``inv.linear`` is the
reference (fixed 64-row tiles of the library gemm), ``triton.linear`` one launch for any number of rows."""

from mini_engine.ops.invariant import linear

__all__ = ["linear"]
