"""Shared fixtures. ``fla`` is blocked before anything imports ``transformers`` (its GPU kernels break CPU)."""

import dataclasses
import os
import sys

sys.modules.setdefault("fla", None)

import pytest  # noqa: E402
import torch  # noqa: E402


def _row_invariant_interpreter_dot() -> None:
    """The interpreter's ``tl.dot`` through ``np.einsum`` rather than ``np.matmul``. With OpenBLAS's FMA cores
    (Haswell, Zen: an AMD EPYC with AVX2, session 19) a row's product came out with other bits depending on where
    it sat in the tile (its edge handling, by all appearances; not traced), and every batch-invariance test of a
    ``tl.dot`` kernel failed there by the BLAS's doing (with ``OPENBLAS_CORETYPE`` Sandybridge, Prescott or
    Nehalem they passed, as on the machines before). A GPU's dot gives each output element the same sum wherever
    its row sits; einsum sums each over k alike. Inputs are cast to the accumulator's dtype as
    ``np.matmul(dtype=)`` casts them (fp8 goes the interpreter's own way)."""
    import numpy as np
    from triton.runtime import interpreter

    matmul_dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating() or (
                b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()):
            return matmul_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        product = np.einsum("...ik,...kj->...ij", a.data, b.data, dtype=d.data.dtype)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot


if not torch.cuda.is_available():  # Triton kernels run in the interpreter: set before any kernel is decorated
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _row_invariant_interpreter_dot()

from hypothesis import settings  # noqa: E402

from mini_engine.generate import stream_greedy  # noqa: E402
from mini_engine.model import ByteTokenizer, HybridModel, build_builtin  # noqa: E402
from mini_engine.model.builtin import builtin_config, init_weights  # noqa: E402
from mini_engine.model.config import FULL, LINEAR  # noqa: E402

# CI explores a fixed set of examples so a landing never depends on luck; local runs keep exploring.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread per xdist worker: two workers with two OpenMP threads each on two cores
    # spin against each other and run the small-op model several times slower.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model():
    return build_builtin("tiny-random")


@pytest.fixture(scope="session")
def two_layer_model():
    """tiny-random cut to one layer of each kind: the interpreter costs ~0.5 s per Triton layer and forward."""
    config = dataclasses.replace(builtin_config("tiny-random"), layer_types=(LINEAR, FULL))
    return init_weights(HybridModel(config))


@pytest.fixture(scope="session")
def tokenizer():
    return ByteTokenizer()


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def reference(tiny_model):
    """reference(prompt, max_tokens) -> greedy tokens of the prompt run cold and alone (memoised)."""
    memo = {}

    def run(prompt, max_tokens, stop_ids=()):
        key = (tuple(prompt), max_tokens, tuple(stop_ids))
        if key not in memo:
            memo[key] = list(stream_greedy(tiny_model, list(prompt), max_tokens, tuple(stop_ids)))
        return memo[key]

    return run
