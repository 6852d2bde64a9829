"""``ops.pdl``: which launches are programmatic dependent launches, and where a device can run them.

(That every dependent launch waits for the kernel before it, and that every kernel taking the flag is launched so
in a decode step, is checked on the compiled PTX: ``test_kernels_compile.py``. That the bits do not change is
checked on a GPU: ``tests/gpu``.)"""

import threading

from mini_engine.ops import pdl

DEPENDENT = {"PDL": True, "launch_pdl": True}


def test_launches_turn_the_options_on_inside_and_back_after():
    assert pdl.options() == {}, "a plain launch outside any decode step"
    with pdl.launches(True):
        assert pdl.options() == DEPENDENT
        with pdl.launches(False):  # an inner scope wins, and gives the outer one back when it ends
            assert pdl.options() == {}
        assert pdl.options() == DEPENDENT
    assert pdl.options() == {}
    assert pdl.options(always=True) == DEPENDENT, "a configuration that is a dependent launch (GemmConfig.pdl)"


def test_the_setting_ends_with_its_scope_on_an_error():
    try:
        with pdl.launches(True):
            raise RuntimeError("a failed step")
    except RuntimeError:
        pass
    assert pdl.options() == {}


def test_another_thread_launches_as_it_chose():
    """The setting is per thread (a context variable): the engine's thread in a decode step does not make a
    server thread's launches dependent."""
    seen = []
    with pdl.launches(True):
        thread = threading.Thread(target=lambda: seen.append(pdl.options()))
        thread.start()
        thread.join()
    assert seen == [{}]


def test_a_device_without_them_is_named():
    assert pdl.available(), "the pinned triton (3.7) has griddepcontrol"
    assert "CUDA GPU; got device cpu" in pdl.supported("cpu")
