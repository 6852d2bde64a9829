"""A Triton prefill forward on CUDA never waits for the device from the host: its uploads go through pinned
memory without a synchronisation (``mini_engine.device.upload``), so the host runs ahead while the kernels
run. Before, each plain upload of a small table drained the stream: 31 waits in one 0.8B forward."""

import pytest
import torch

from mini_engine.model import build_builtin


@pytest.fixture(scope="module")
def cuda_model():
    return build_builtin("tiny-random").cuda()


@pytest.mark.parametrize("snapshots", ["all", "last"])
def test_triton_forward_does_not_synchronise(cuda_model, snapshots):
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (200, 65, 3)]  # on the host, as the engine's
    expected = cuda_model(prompts, [cuda_model.new_state() for _ in prompts], kernels="triton")  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outputs = cuda_model(prompts, [cuda_model.new_state() for _ in prompts], kernels="triton",
                             snapshots=snapshots)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for got, want in zip(outputs, expected):
        assert torch.equal(got.logits, want.logits)
        assert [s.position for s in got.snapshots] == [s.position for s in want.snapshots][-len(got.snapshots):]
