"""How the Triton kernels multiply tiles: ``tl.dot``'s ``input_precision`` by input dtype.

16-bit inputs use the tensor cores as they are. float32 inputs are held to the float32 references at 1e-5,
which TF32 (a 10-bit mantissa) misses; IEEE float32 dots run on the FMA units, and there the prefill's
chunk and attention tiles ran about 100 times under the FMA rate on the H200 (the gated delta rule's
``_wy_scores_kernel``: 3.8 ms per layer for 1.6 GFLOP at 2,048 tokens, measured). "tf32x3" splits each
operand into a TF32 high part and a TF32 remainder and adds three tensor-core products: about float32's
accuracy at the tensor cores' rate. Either way a program's arithmetic is fixed by its shapes, so the
kernels stay batch-invariant.
"""

from __future__ import annotations

import torch

__all__ = ["FP32_DOT", "dot_precision"]

FP32_DOT = "tf32x3"


def dot_precision(dtype: torch.dtype) -> str:
    """The ``input_precision`` for inputs of ``dtype`` (Triton ignores it for 16-bit inputs)."""
    return FP32_DOT if dtype == torch.float32 else "tf32"
