"""A Gated DeltaNet layer's decode step in the interpreter: ``gdn_step`` gives the chain it fuses bit for bit
(output, conv states, pending rows, boundary states, running copies), and every program of a step reads the
running copy's count the last step left."""

import pytest
import torch

from mini_engine.ops.decode_rows.gdn_step import gdn_step
from mini_engine.ops.gated_delta_rule.launch import LaunchConfig
from mini_engine.ops.gated_delta_rule.triton_decode import pending_replay_decode_triton
from tests.unit.gdn_step_support import (
    OUT_ROWS,
    check_gdn_step,
    check_memo_per_step,
    check_replay_norm,
    gdn_case,
    run_fused,
    step_args,
)


@pytest.mark.parametrize(("heads", "head_dims"), [((2, 4), (16, 32)), ((3, 3), (16, 16))], ids=["gqa", "mha"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_gdn_step_is_the_chain_it_fuses(heads, head_dims, dtype):
    check_gdn_step(heads=heads, head_dims=head_dims, dtype=dtype, device="cpu", exact=True)


@pytest.mark.parametrize("block_v", [16, 32], ids=["two-tiles", "one-tile"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_the_output_norm_in_the_replays_launch_is_the_chains(block_v, dtype):
    check_replay_norm(heads=(2, 4), head_dims=(16, 32), dtype=dtype, device="cpu", config=LaunchConfig(block_v))


def test_the_replays_output_norm_refuses_what_it_cannot_lay_out():
    """The norm's arguments come together, and its output rows hold the batch: else an error that names them."""
    case = gdn_case(heads=(2, 4), head_dims=(16, 32), device="cpu")
    args = step_args(case, (0, 10, 63, 30), torch.float32, "cpu", seed=1)
    replay = dict(new_rows=torch.zeros(4, args["pending_pool"].shape[2]), pending_pool=args["pending_pool"],
                  rec_pool=args["rec_pool"], slots=args["slots"], rows=args["rows"], heads=case.heads)
    with pytest.raises(ValueError, match="out_rows >= 4"):
        pending_replay_decode_triton(**replay, z=args["z"], norm_weight=case.weights["norm_weight"], eps=1e-6,
                                     out_rows=2, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="go with z"):
        pending_replay_decode_triton(**replay, eps=1e-6)


def test_every_program_of_a_step_reads_the_last_steps_memo():
    check_memo_per_step(device="cpu")


def test_gdn_step_refuses_what_it_cannot_step():
    """Inputs the kernel would misread are errors that name what to pass."""
    case = gdn_case(heads=(2, 4), head_dims=(16, 32), device="cpu")
    args = step_args(case, (0, 10, 63, 30), torch.float32, "cpu", seed=1)
    with pytest.raises(ValueError, match="out_rows"):
        gdn_step(**args, conv_weight=case.weights["conv_weight"], A_log=case.weights["A_log"],
                 dt_bias=case.weights["dt_bias"], heads=case.heads, head_dims=case.head_dims,
                 norm_weight=case.weights["norm_weight"], eps=1e-6, out_rows=2, out_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"run_rows int32 \[8, 2\]"):
        run_fused(case, {**args, "run_rows": args["run_rows"][:, 0]}, torch.float32)
    with pytest.raises(ValueError, match="Hv must be a multiple of Hk"):
        run_fused(case._replace(heads=(3, 4)), args, torch.float32)
    with pytest.raises(ValueError, match="go together"):
        run_fused(case, {**args, "run_rows": None}, torch.float32)
    assert run_fused(case, {**args, "run_pool": None, "run_rows": None}, torch.float32).shape == (OUT_ROWS, 4 * 32)
