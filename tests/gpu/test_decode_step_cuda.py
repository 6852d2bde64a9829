"""``decode_step`` on the GPU, held to the same checks as in the interpreter (``tests/unit/test_decode_step.py``):
logits and pools against ``HybridModel.forward``, nothing written outside the named slots and pages,
and a sequence's bits the same alone as in a batch."""

import pytest

from mini_engine.device.cuda import CudaDevice
from mini_engine.model import build_builtin
from tests.unit import test_decode_step as spec
from tests.unit.test_decode_step import (  # noqa: F401 - collected here against the cuda fixture
    test_a_sequence_gets_the_same_bits_alone_as_in_a_batch,
    test_logits_match_the_model_forward,
    test_nothing_outside_the_named_slots_and_pages_changes,
    test_pages_hold_the_new_keys_and_values,
    test_slots_hold_the_advanced_states,
)


@pytest.fixture(scope="module")
def setup():
    return spec.build(build_builtin("tiny-random").cuda(), CudaDevice())
