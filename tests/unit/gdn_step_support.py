"""Checks of a Gated DeltaNet layer's decode step on chunk-exact slots (``gdn_step`` against the chain it fuses,
and the running copy's memo), shared by the interpreter tests (tests/unit/test_gdn_step.py) and the CUDA tests
(tests/gpu/test_decode_step_cuda.py).

The slots are one layer of an engine-like ``[slots, layers, ...]`` store and sit in every state a step meets: at
a boundary, with pending rows and a running copy, with pending rows and a stale memo, and one token short of
completing its chunk.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mini_engine.ops.decode_rows.gdn_prepare import conv_gdn_rows
from mini_engine.ops.decode_rows.gdn_step import gdn_step
from mini_engine.ops.decode_rows.triton import gated_rms_norm
from mini_engine.ops.gated_delta_rule.triton_decode import pending_replay_decode_triton
from mini_engine.ops.invariant import l2_normalize
from tests.unit.kernel_support import TOLERANCE, randn, relative_error

SLOTS, PENDING = (5, 2, 6, 3), (0, 10, 63, 30)  # per live row: its slot and the rows since its boundary
MEMO = 2  # the slot whose running copy follows its pending rows
OUT_ROWS, WIDTH, LAYER = 8, 4, 1  # padded output rows, conv width, the layer stepped (of two)


class Case(NamedTuple):
    heads: tuple[int, int]
    head_dims: tuple[int, int]
    weights: dict  # conv_weight, A_log, dt_bias, norm_weight, eps
    pools: dict  # conv, rec, pending, run, run_rows: [slots, layers, ...]


def gdn_case(*, heads, head_dims, device, seed=0) -> Case:
    """Slots of one layer's worth of random state, pending rows shaped as prepared rows (unit q and k, g < 0,
    beta in (0, 1)), and the memo of slot ``MEMO`` following its rows."""
    (hk, hv), (dk, dv) = heads, head_dims
    gen = torch.Generator().manual_seed(seed)
    conv_dim, n_slots = 2 * hk * dk + hv * dv, 8
    q, k = (l2_normalize(randn(n_slots, 2, 63, hk, dk, gen=gen)).flatten(3) for _ in range(2))
    gates = torch.cat([-0.5 * torch.rand(n_slots, 2, 63, hv, generator=gen),
                       torch.sigmoid(randn(n_slots, 2, 63, hv, gen=gen))], dim=-1)
    pools = dict(conv=randn(n_slots, 2, conv_dim, WIDTH - 1, gen=gen),
                 rec=0.3 * randn(n_slots, 2, hv, dk, dv, gen=gen), run=0.3 * randn(n_slots, 2, hv, dk, dv, gen=gen),
                 pending=torch.cat([q, k, randn(n_slots, 2, 63, hv * dv, gen=gen), gates], dim=-1),
                 run_rows=torch.full((n_slots, 2, 2), -1, dtype=torch.int32))
    pools["run_rows"][MEMO, LAYER, PENDING[SLOTS.index(MEMO)] % 2] = PENDING[SLOTS.index(MEMO)]
    weights = dict(conv_weight=randn(conv_dim, WIDTH, gen=gen), A_log=randn(hv, gen=gen), dt_bias=randn(hv, gen=gen),
                   norm_weight=randn(dv, gen=gen), eps=1e-6)
    to = lambda d: {name: t.to(device) if isinstance(t, torch.Tensor) else t for name, t in d.items()}  # noqa: E731
    return Case(heads, head_dims, to(weights), to(pools))


def step_args(case: Case, pending: tuple[int, ...], dtype, device, seed) -> dict:
    """One step's arguments on ``case``'s layer: a fused projection output (qkv | z | b | a) and the indices."""
    (hk, hv), (dk, dv) = case.heads, case.head_dims
    conv_dim = 2 * hk * dk + hv * dv
    proj = randn(OUT_ROWS, conv_dim + hv * dv + 2 * hv, gen=torch.Generator().manual_seed(seed), dtype=dtype,
                 device=device)
    z, b, a = proj[:, conv_dim:].split([hv * dv, hv, hv], dim=-1)
    index = lambda values: torch.tensor(values, device=device)  # noqa: E731
    complete = [n == 63 for n in pending]
    pools = {name: t[:, LAYER] for name, t in case.pools.items()}
    return dict(x=proj[: len(SLOTS), :conv_dim], z=z, a=a, b=b, slots=index(SLOTS), rows=index(pending),
                pending_slots=index([0 if c else s for s, c in zip(SLOTS, complete)]),
                pending_rows=index([62 if c else n for n, c in zip(pending, complete)]), conv_pool=pools["conv"],
                pending_pool=pools["pending"], rec_pool=pools["rec"], run_pool=pools["run"], run_rows=pools["run_rows"])


def run_fused(case: Case, args: dict, out_dtype) -> torch.Tensor:
    """``gdn_step`` into an output buffer of NaNs: every element must be written (padding rows as zeros)."""
    w, (hv, dv) = case.weights, (case.heads[1], case.head_dims[1])
    out = torch.full((OUT_ROWS, hv * dv), float("nan"), dtype=out_dtype, device=args["x"].device)
    got = gdn_step(**args, conv_weight=w["conv_weight"], A_log=w["A_log"], dt_bias=w["dt_bias"], heads=case.heads,
                   head_dims=case.head_dims, norm_weight=w["norm_weight"], eps=w["eps"], out_rows=OUT_ROWS,
                   out_dtype=out_dtype, out=out)
    assert got is out
    return got


def run_chain(case: Case, args: dict, out_dtype, *, norm_in_replay: bool = False, config=None) -> torch.Tensor:
    """The three launches ``gdn_step`` fuses, as the decode step ran them before; with ``norm_in_replay`` two: the
    output norm in the replay's launch (``config``: the replay's V tile)."""
    w, rows = case.weights, dict(args)
    z, rec, run, run_rows, n_pending = (rows.pop(name) for name in ("z", "rec_pool", "run_pool", "run_rows", "rows"))
    row = conv_gdn_rows(**rows, conv_weight=w["conv_weight"], A_log=w["A_log"], dt_bias=w["dt_bias"],
                        heads=case.heads, head_dims=case.head_dims)
    replay = dict(new_rows=row, pending_pool=args["pending_pool"], rec_pool=rec, slots=args["slots"], rows=n_pending,
                  heads=case.heads, run_pool=run, run_rows=run_rows, config=config)
    norm = dict(z=z, eps=w["eps"], out_dtype=out_dtype)
    if norm_in_replay:
        return pending_replay_decode_triton(**replay, **norm, norm_weight=w["norm_weight"], out_rows=OUT_ROWS)
    return gated_rms_norm(core=pending_replay_decode_triton(**replay), **norm, weight=w["norm_weight"], rows=OUT_ROWS)


def check_replay_norm(*, heads, head_dims, dtype, device, config=None) -> None:
    """Two steps in a row with the output norm in the replay's launch (``pending_replay_decode_triton(z=...)``, made
    by each value head's last V tile to finish; ``config``: its V tile) against the three launches: the output and
    every pool bit for bit (the norm's own arithmetic on the same stored output, on a GPU too), padding rows zero,
    and the heads' counters back at zero."""
    from mini_engine.ops.counters import counters

    out_dtype = torch.float32 if dtype == torch.float32 else dtype
    two, chain = (gdn_case(heads=heads, head_dims=head_dims, device=device) for _ in range(2))
    for step in range(2):
        pending = tuple((n + step) % 64 for n in PENDING)
        got = run_chain(two, step_args(two, pending, dtype, device, seed=20 + step), out_dtype, norm_in_replay=True,
                        config=config)
        want = run_chain(chain, step_args(chain, pending, dtype, device, seed=20 + step), out_dtype)
        assert got.dtype == out_dtype and got.shape == want.shape and not got[len(SLOTS):].any()
        assert torch.equal(got, want), f"step {step}: output"
        for name, t in two.pools.items():
            assert torch.equal(t, chain.pools[name]), f"step {step}: {name}"
    assert not counters(1, device).any(), "a head's counter was left set"


def check_gdn_step(*, heads, head_dims, dtype, device, exact: bool) -> None:
    """Two steps in a row (the second follows the first's running copies): ``gdn_step``'s output and every pool
    against the chain's, bit for bit (``exact``: the interpreter) or within the dtype's tolerance (a GPU, where a
    whole-head tile reduces over other trees), and padding rows zero."""
    out_dtype = torch.float32 if dtype == torch.float32 else dtype
    fused, chain = (gdn_case(heads=heads, head_dims=head_dims, device=device) for _ in range(2))
    for step in range(2):
        pending = tuple((n + step) % 64 for n in PENDING)
        got = run_fused(fused, step_args(fused, pending, dtype, device, seed=10 + step), out_dtype)
        want = run_chain(chain, step_args(chain, pending, dtype, device, seed=10 + step), out_dtype)
        assert got.dtype == out_dtype and got.shape == want.shape and torch.equal(got[len(SLOTS):],
                                                                                   torch.zeros_like(got[len(SLOTS):]))
        _same(got, want, TOLERANCE[dtype], exact, f"step {step}: output")
        for name, t in fused.pools.items():
            _same(t, chain.pools[name], 1e-5, exact, f"step {step}: {name}")


def _same(got: torch.Tensor, want: torch.Tensor, tolerance: float, exact: bool, what: str) -> None:
    if exact or not got.is_floating_point():
        assert torch.equal(got, want), what
    else:
        assert relative_error(got.float(), want.float()) <= tolerance, what


def check_memo_per_step(*, device) -> None:
    """A slot whose running copy follows its pending rows: every program of the step (every head and V tile)
    starts from that copy, none from a count a sibling program of the same step has already moved on. The copy
    is zeros here, unlike the state its rows replay to, so a program that replayed shows in the output."""
    case = gdn_case(heads=(2, 4), head_dims=(16, 16), device=device)
    zero = gdn_case(heads=(2, 4), head_dims=(16, 16), device=device)
    case.pools["run"][MEMO].zero_()
    zero.pools["rec"][MEMO].zero_()  # the reference: the new row alone from a zero state at a boundary
    pending = list(PENDING)
    args = step_args(case, tuple(pending), torch.float32, device, seed=5)
    got = pending_replay_decode_triton(new_rows=_rows(case, args), pending_pool=args["pending_pool"],
                                       rec_pool=args["rec_pool"], slots=args["slots"], rows=args["rows"],
                                       heads=case.heads, run_pool=args["run_pool"], run_rows=args["run_rows"])
    pending[SLOTS.index(MEMO)] = 0
    ref = step_args(zero, tuple(pending), torch.float32, device, seed=5)
    want = pending_replay_decode_triton(new_rows=_rows(zero, ref), pending_pool=ref["pending_pool"],
                                        rec_pool=ref["rec_pool"], slots=ref["slots"], rows=ref["rows"],
                                        heads=zero.heads)
    row = SLOTS.index(MEMO)
    assert torch.equal(got[row], want[row]), "a program of the step replayed instead of reading the running copy"


def _rows(case: Case, args: dict) -> torch.Tensor:
    """The step's prepared rows (``conv_gdn_rows`` on a copy of the conv pool: the case's is left as it was)."""
    w = case.weights
    return conv_gdn_rows(x=args["x"], conv_weight=w["conv_weight"], conv_pool=args["conv_pool"].clone(),
                         slots=args["slots"], a=args["a"], b=args["b"], A_log=w["A_log"], dt_bias=w["dt_bias"],
                         heads=case.heads, head_dims=case.head_dims)
