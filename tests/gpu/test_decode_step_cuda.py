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


@pytest.mark.parametrize(("dtype", "gemm", "dependent"), [("float32", "cublas", False), ("float32", "cublas", True),
                                                         ("bfloat16", "triton", True)])
def test_graph_replays_give_the_eager_steps_bits(dtype, gemm, dependent):
    """Four steps through ``DecodeGraphs`` (eager, capture, replay, replay) against four eager steps on a copy
    of the pools (running copies included): the same logits bit for bit at every step (and the greedy tokens the
    graph picks and stores), and the same pools after.
    With ``dependent`` the graphed steps launch their Triton kernels as programmatic dependent launches
    (``ops.pdl``; the Triton gemms' too in bfloat16) and the eager ones do not: each kernel waits for the one
    before it, so the bits are the same."""
    import torch

    from mini_engine.engine.storage import KVStorage, StateStorage
    from mini_engine.model.decode import DecodeGraphs, DecodeModel, Pools, decode_step
    from mini_engine.ops import pdl

    if dependent and pdl.supported("cuda"):
        pytest.skip(pdl.supported("cuda"))
    model = build_builtin("tiny-random").cuda().cast_projections(getattr(torch, dtype))
    device, steps = CudaDevice(), 4
    states = StateStorage(model.config, 8, device, running=True)
    kv = KVStorage(model.config, 1024, spec.PAGE, device)
    tables = [[1 + b + 6 * i for i in range(-(-(length + steps) // spec.PAGE))] for b, length in enumerate(spec.LENGTHS)]
    spec._prefill(model, states, kv, tables, torch.Generator().manual_seed(5))
    width = max(map(len, tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device="cuda")
    graphed = Pools(states.conv, states.rec, states.pending, kv.keys, kv.values, states.run, states.run_rows)
    eager = Pools(*(t.clone() for t in graphed))
    fused = DecodeModel(model, gemm=gemm)
    runner = DecodeGraphs(DecodeModel(model, gemm=gemm, pdl=dependent), graphed, states.next_token)
    slots = list(spec.SLOTS)
    gen = torch.Generator().manual_seed(9)
    for step in range(steps):
        positions = [length + step for length in spec.LENGTHS]
        tokens = torch.randint(0, model.config.vocab_size, (len(slots),), generator=gen).cuda()
        want = decode_step(fused, eager, tokens, slots, positions, table)
        states.next_token[torch.tensor(slots, device="cuda")] = tokens
        got, results = runner(slots, positions, table)
        assert torch.equal(got, want), f"step {step}"
        greedy = want.argmax(-1)  # picked in the graph too, and stored as the slots' next tokens
        assert torch.equal(results[:, 0], greedy) and torch.equal(states.next_token[slots], greedy), f"step {step}"
    assert (runner.captures, runner.replays) == (1, steps - 1)
    for name, a, b in zip(Pools._fields, graphed, eager):
        assert torch.equal(a[1:], b[1:]), name  # slot/page 0 is the sink: what lands there is nobody's


def test_the_running_copy_gives_the_replays_bits_on_the_gpu():
    spec.check_running_copy(build_builtin("tiny-random").cuda(), CudaDevice(), steps=4)


def test_the_ledgers_step_digests_replay_with_the_step_on_the_gpu():
    """Three steps (eager, captured, replayed) with the ledger's digests in the step's graph: each step's digests
    are the reference digests of the bytes that step left and read."""
    spec.check_step_digests(build_builtin("tiny-random").cuda(), CudaDevice(), steps=3)


def test_the_triton_gemm_matches_cublas_and_keeps_a_rows_bits():
    """bfloat16 projections through the Triton decode gemm (``DecodeModel(gemm="triton")``, and per weight where
    it timed faster, ``"auto"``, or where the packaged table says it did on this GPU model, ``"tuned"``): the
    step's logits within bf16 rounding of the cuBLAS step's, and a sequence's bits the same alone as in the
    batch."""
    import torch

    from mini_engine.ops.decode_rows import gemm
    from tests.unit.kernel_support import relative_error

    model = build_builtin("tiny-random").cuda().cast_projections(torch.bfloat16)
    cublas = spec.build(model, CudaDevice())
    for mode in ("triton", "auto", "tuned"):
        got = spec.build(model, CudaDevice(), gemm=mode)
        assert relative_error(got[4], cublas[4]) <= 2e-2, mode
        assert torch.equal(got[6][0], got[4][spec.ALONE]), mode
    weight = model.model.layers[0].mlp.down_proj.weight
    assert gemm.choose(weight) in (None, *gemm.configs(*weight.shape))


def test_the_tuned_table_is_read_by_this_gpus_name():
    """Each weight the packaged table lists for this GPU model gets the table's choice on this device (the name
    ``scripts/tune_decode_gemms.py`` recorded is the one the engine looks up)."""
    import torch

    from mini_engine.ops.decode_rows import gemm, tuned

    name = torch.cuda.get_device_name()
    entries = tuned.load().get(name)
    if not entries:
        pytest.skip(f"the package's table has no choices for {name!r} (scripts/tune_decode_gemms.py writes them)")
    for key, entry in entries.items():
        dtype, shape = key.split(" ")
        weight = torch.zeros(*map(int, shape.split("x")), dtype=getattr(torch, dtype), device="cuda")
        want = None if entry["config"] is None else gemm.GemmConfig(**entry["config"])
        assert tuned.tuned(weight) == (want if want is None or tuned.launchable(want) else None), key


def test_a_table_file_gives_its_choices_by_this_gpus_name():
    """``EngineConfig.decode_gemm_table``'s table, read in the package's place: a weight it lists for this GPU model
    gets its choice, one it does not list cuBLAS, whatever the package's table says of either."""
    import torch

    from mini_engine.ops.decode_rows import gemm, tuned

    listed = torch.zeros(1024, 3584, dtype=torch.bfloat16, device="cuda")
    unlisted = torch.zeros(7168, 1024, dtype=torch.bfloat16, device="cuda")
    choice = gemm.configs(*listed.shape)[0]  # a plain tile: launchable with any triton
    key = tuned.entry_key(listed.dtype, tuple(listed.shape))
    table = {torch.cuda.get_device_name(): {key: {"config": choice._asdict(), "us": 1.0, "cublas_us": 2.0}}}
    assert tuned.tuned(listed, table) == choice
    assert tuned.tuned(unlisted, table) is None
    assert tuned.tuned(listed, {"another GPU": table[torch.cuda.get_device_name()]}) is None


@pytest.mark.parametrize("dependent", [False, True])
def test_a_split_gemms_parts_added_by_the_norm_on_the_gpu(dependent):
    """A split gemm's K parts added by the residual's norm give the second launch's bits on the GPU too (the two
    kernels compiled apart add in the same order): four bfloat16 steps, the down projections' split as the swapped
    TMA tile, plain launches and (Hopper on) every kernel a dependent launch."""
    import torch

    from mini_engine.ops import pdl
    from mini_engine.ops.decode_rows import gemm

    if dependent and pdl.supported("cuda"):
        pytest.skip(pdl.supported("cuda"))
    down = gemm.GemmConfig(64, 32, split_k=4, swap=True, tma=True, pdl=dependent)
    spec.check_split_sums(build_builtin("tiny-random").cuda().cast_projections(torch.bfloat16), CudaDevice(), steps=4,
                          down=down, dependent=dependent)


@pytest.mark.parametrize("dependent", [False, True])
def test_silu_mul_in_the_gate_up_gemms_launch_on_the_gpu(dependent):
    """SiLU(gate) * up in the gate | up gemm's epilogue gives ``silu_mul``'s own launch's bits on the GPU too (the two
    kernels compiled apart share its arithmetic): four bfloat16 steps, the gate | up as the swapped TMA tile the
    packaged tables choose for it, plain launches and (Hopper on) every kernel a dependent launch."""
    import torch

    from mini_engine.ops import pdl
    from mini_engine.ops.decode_rows import gemm

    if dependent and pdl.supported("cuda"):
        pytest.skip(pdl.supported("cuda"))
    config = gemm.GemmConfig(64, 128, swap=True, tma=True, pdl=dependent)
    spec.check_swiglu(build_builtin("tiny-random").cuda().cast_projections(torch.bfloat16), CudaDevice(), steps=4,
                      config=config, dependent=dependent)


def test_the_one_and_two_launch_gdn_steps_agree_with_the_split_steps_on_the_gpu():
    """Each GDN layer's conv, replay and norm in one launch (whole-head tiles): the split steps' logits and pools to
    rounding over four steps (chunk completions, running copies), and the one-launch kernel against its chain; the
    replay and norm in one launch (the norm by each head's last V tile): bit for bit, in the step and alone."""
    import torch

    from tests.unit.gdn_step_support import check_gdn_step, check_memo_per_step, check_replay_norm

    spec.check_gdn_step_variants(build_builtin("tiny-random").cuda(), CudaDevice(), exact=("two",), steps=4)
    for heads, dims in (((2, 4), (16, 32)), ((16, 16), (128, 128))):  # the tiny model's GQA, Qwen3.5-0.8B's heads
        check_gdn_step(heads=heads, head_dims=dims, dtype=torch.bfloat16, device="cuda", exact=False)
        check_replay_norm(heads=heads, head_dims=dims, dtype=torch.bfloat16, device="cuda")  # the same bits
    check_memo_per_step(device="cuda")


@pytest.mark.parametrize("n_out, n_in", [(8224, 1024), (1024, 3584), (260, 1024)])
def test_every_gemm_configuration_on_the_gpu(n_out, n_in):
    """Each candidate ``gemm.choose`` may pick (the swapped tile by address and by TMA descriptor included), the
    swapped splits with their parts added in the same launch (``fused_sum``: the two-launch split's bits, on real
    concurrent programs), and the TMA tiles as programmatic dependent launches (also asking the L2 for their weight
    rows before their wait, ``prefetch``: their twins' bits), at the 0.8B model's shapes in bfloat16: within bf16
    rounding of the float32 product, rows past the batch zero, and a row's bits the same alone as in a batch of 20
    (two live 16-row tiles)."""
    import torch

    from mini_engine.ops.decode_rows import gemm
    from tests.unit.kernel_support import relative_error

    gen = torch.Generator(device="cuda").manual_seed(3)
    weight = (torch.randn(n_out, n_in, device="cuda", generator=gen) * n_in**-0.5).bfloat16()
    x = torch.zeros(64, n_in, device="cuda", dtype=torch.bfloat16)
    x[:20] = torch.randn(20, n_in, device="cuda", generator=gen).bfloat16()
    alone = torch.zeros(64, n_in, device="cuda", dtype=torch.bfloat16)
    alone[0] = x[17]
    want = x[:20].float() @ weight.float().T
    candidates = gemm.configs(n_out, n_in)
    fused = [c._replace(fused_sum=True) for c in candidates if c.swap and c.split_k > 1]
    dependent = [c._replace(pdl=True) for c in candidates + fused if c.tma]
    early = [c._replace(prefetch=columns) for c in dependent for columns in (2 * c.block_k, n_in)]  # 2 stages, all
    for config in candidates + fused + dependent + early:
        got = gemm.linear(x, weight, rows=20, config=config)
        assert relative_error(got[:20], want) <= 1e-2 and not got[20:].any(), config
        assert torch.equal(gemm.linear(alone, weight, rows=1, config=config)[0], got[17]), config
        if config.fused_sum:
            two_launches = gemm.linear(x, weight, rows=20, config=config._replace(fused_sum=False, pdl=False,
                                                                                   prefetch=0))
            assert torch.equal(got, two_launches), config
        if config.prefetch:  # asking the L2 for the weight first changes no bit
            assert torch.equal(got, gemm.linear(x, weight, rows=20, config=config._replace(prefetch=0))), config
