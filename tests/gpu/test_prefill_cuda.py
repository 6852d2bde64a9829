"""A Triton prefill forward on CUDA never waits for the device from the host: its uploads go through pinned
memory without a synchronisation (``mini_engine.device.upload``), so the host runs ahead while the kernels
run. Before, each plain upload of a small table drained the stream: 31 waits in one 0.8B forward. And it
uploads a batch's tables once, not once per layer."""

from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from mini_engine.model import build_builtin
from mini_engine.model.builtin import init_weights
from mini_engine.model.hybrid import HybridModel


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


def _host_to_device_copies(model, prompts) -> int:
    states = [model.new_state() for _ in prompts]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(prompts, states, kernels="triton")
        torch.cuda.synchronize()
    return sum(event.count for event in prof.key_averages() if "HtoD" in event.key)


def test_a_triton_forward_uploads_per_batch_not_per_layer(cuda_model):
    """Twice the layers, the same host-to-device copies: the tokens, positions and offsets go up once for the
    forward (each conv and attention layer uploaded the offsets again before)."""
    config = cuda_model.config
    deeper = init_weights(HybridModel(replace(config, layer_types=config.layer_types * 2))).eval().cuda()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (130, 7)]
    for model in (cuda_model, deeper):  # compiles, and fills the per-layout tables both share
        model(prompts, [model.new_state() for _ in prompts], kernels="triton")
    shallow_copies, deep_copies = (_host_to_device_copies(model, prompts) for model in (cuda_model, deeper))
    assert shallow_copies > 0
    assert deep_copies == shallow_copies
