"""The decode step's per-row kernels match their float32 references in the interpreter (fp32 1e-5, fp16 out 1e-2):
odd widths, padded rows written as zeros, inputs that are column slices of one fused projection output."""

import pytest
import torch

from mini_engine.ops import decode_rows as reference
from mini_engine.ops.counters import counters
from mini_engine.ops.decode_rows import gdn_prepare as gdn_kernels
from mini_engine.ops.decode_rows import gemm
from mini_engine.ops.decode_rows import triton as kernels
from tests.unit.kernel_support import TOLERANCE, randn, relative_error

BATCH, ROWS = 3, 8  # three sequences in rows padded to eight


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert relative_error(actual, expected) <= TOLERANCE[expected.dtype]


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("with_delta", [False, True], ids=["first", "residual"])
def test_add_rms_norm(out_dtype, with_delta):
    """The residual sum lands in x (float32) and the offset RMSNorm of it comes out in the projection's dtype."""
    gen = torch.Generator().manual_seed(1)
    x, delta, weight = randn(ROWS, 100, gen=gen), randn(ROWS, 100, gen=gen, dtype=out_dtype), randn(100, gen=gen)
    x[BATCH:] = 0
    want_x, got_x = x.clone(), x.clone()
    want = reference.add_rms_norm(x=want_x, delta=delta if with_delta else None, weight=weight, eps=1e-6,
                                  out_dtype=out_dtype)
    got = kernels.add_rms_norm(x=got_x, delta=delta if with_delta else None, weight=weight, eps=1e-6,
                               out_dtype=out_dtype)
    _close(got, want)
    assert relative_error(got_x, want_x) <= 1e-6


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=str)
def test_padding_rows_are_written_as_zeros_and_never_read(out_dtype):
    """With ``live`` rows of a padded batch: the live rows as with every row live, bit for bit; the padding rows'
    outputs zeros even where their inputs hold NaNs, and the residual's padding rows left as they were."""
    gen = torch.Generator().manual_seed(14)
    x, delta, weight = randn(ROWS, 100, gen=gen), randn(ROWS, 100, gen=gen, dtype=out_dtype), randn(100, gen=gen)
    gate_up = randn(ROWS, 2 * 1500, gen=gen, dtype=out_dtype)
    x[BATCH:], delta[BATCH:], gate_up[BATCH:] = float("nan"), float("nan"), float("nan")
    every, padded = x.clone(), x.clone()
    want = kernels.add_rms_norm(x=every, delta=delta, weight=weight, eps=1e-6, out_dtype=out_dtype)
    got = kernels.add_rms_norm(x=padded, delta=delta, weight=weight, eps=1e-6, out_dtype=out_dtype, live=BATCH)
    assert torch.equal(got[:BATCH], want[:BATCH]) and torch.equal(padded[:BATCH], every[:BATCH])
    assert not got[BATCH:].any() and padded[BATCH:].isnan().all()
    act = kernels.silu_mul(gate_up=gate_up, out_dtype=out_dtype, live=BATCH)
    assert torch.equal(act[:BATCH], kernels.silu_mul(gate_up=gate_up, out_dtype=out_dtype)[:BATCH])
    assert not act[BATCH:].any()


def test_gdn_rows_and_their_pending_copies():
    """q and k L2-normalised per key head, v, the gates (softplus across its threshold and far below zero), and
    the same row stored at each sequence's (pending slot, row); nothing else in the pool changes."""
    gen = torch.Generator().manual_seed(2)
    hk, hv, dk, dv = 2, 4, 16, 8
    conv_dim = 2 * hk * dk + hv * dv
    fused = randn(ROWS, conv_dim + 2 * hv + 5, gen=gen)  # conv | b | a | other columns
    fused[:, conv_dim + hv : conv_dim + 2 * hv] = torch.tensor([-30.0, -3.0, 5.0, 25.0])  # a across softplus's range
    conv = fused[:BATCH, :conv_dim]
    b, a = fused[:, conv_dim : conv_dim + hv], fused[:, conv_dim + hv : conv_dim + 2 * hv]
    A_log, dt_bias = randn(hv, gen=gen), randn(hv, gen=gen)
    heads, dims = (hk, hv), (dk, dv)
    want = reference.gdn_rows(conv=conv, a=a[:BATCH], b=b[:BATCH], A_log=A_log, dt_bias=dt_bias, heads=heads,
                              head_dims=dims)
    pool = torch.full((5, 63, want.shape[1]), float("nan"))
    slots, rows = torch.tensor([4, 0, 2]), torch.tensor([0, 62, 17])
    got = gdn_kernels.gdn_rows(conv=conv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, heads=heads, head_dims=dims,
                           pending_pool=pool, pending_slots=slots, pending_rows=rows)
    _close(got, want)
    for i, (slot, row) in enumerate(zip(slots, rows)):
        assert torch.equal(pool[slot, row], got[i])
    assert int(pool.isnan().all(-1).sum()) == 5 * 63 - BATCH


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=str)
def test_gated_rms_norm(out_dtype):
    """Per value head weight * rmsnorm(core) * silu(z); z read from a strided slice; padding rows zero."""
    gen = torch.Generator().manual_seed(3)
    core, fused, weight = randn(BATCH, 4, 24, gen=gen), randn(ROWS, 4 * 24 + 7, gen=gen), randn(24, gen=gen)
    z = fused[:, 3 : 3 + 4 * 24]
    args = dict(core=core, z=z, weight=weight, eps=1e-6, rows=ROWS, out_dtype=out_dtype)
    got = kernels.gated_rms_norm(**args)
    _close(got, reference.gated_rms_norm(**args))
    assert not got[BATCH:].any()


def test_qk_norm_rope():
    """q and k normed per head and rotated on their first rotary channels at each position; v copied; the output
    gates interleaved with the queries are skipped."""
    gen = torch.Generator().manual_seed(4)
    hq, hkv, d = 4, 2, 24
    qkv = randn(ROWS, (2 * hq + 2 * hkv) * d, gen=gen)
    inv_freq = 1.0 / (10_000 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
    args = dict(qkv=qkv, batch=BATCH, positions=torch.tensor([0, 7, 4100]), q_weight=randn(d, gen=gen),
                k_weight=randn(d, gen=gen), inv_freq=inv_freq, eps=1e-6, heads=(hq, hkv), head_dim=d)
    for got, want in zip(kernels.qk_norm_rope(**args), reference.qk_norm_rope(**args)):
        _close(got, want)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=str)
def test_sigmoid_mul_and_silu_mul(out_dtype):
    """The attention output gate and the SwiGLU activation; padding rows of the gate's output zero."""
    gen = torch.Generator().manual_seed(5)
    attn, qkv = randn(BATCH, 4, 24, gen=gen), randn(ROWS, 2 * 4 * 24 + 48, gen=gen)
    args = dict(attn=attn, qkv=qkv, heads=4, head_dim=24, rows=ROWS, out_dtype=out_dtype)
    got = kernels.sigmoid_mul(**args)
    _close(got, reference.sigmoid_mul(**args))
    assert not got[BATCH:].any()
    gate_up = randn(ROWS, 2 * 1500, gen=gen)  # two column blocks of the kernel, the second partial
    _close(kernels.silu_mul(gate_up=gate_up, out_dtype=out_dtype),
           reference.silu_mul(gate_up=gate_up, out_dtype=out_dtype))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=str)
def test_silu_mul_of_gate_and_up_in_blocks(out_dtype):
    """``block``: gate and up alternate in blocks of columns (``FusedProjection(block=)``); the activation of each
    column is the one of the same gate and up side by side, bit for bit; padding rows zero; a width that is not a
    multiple of two blocks is refused by name."""
    gen = torch.Generator().manual_seed(6)
    gate, up = randn(ROWS, 96, gen=gen), randn(ROWS, 96, gen=gen)
    blocked = torch.stack([gate.unflatten(1, (-1, 32)), up.unflatten(1, (-1, 32))], 2).flatten(1)
    got = kernels.silu_mul(gate_up=blocked, out_dtype=out_dtype, live=BATCH, block=32)
    assert torch.equal(got[:BATCH], kernels.silu_mul(gate_up=torch.cat([gate, up], 1), out_dtype=out_dtype)[:BATCH])
    assert not got[BATCH:].any()
    _close(got[:BATCH], reference.silu_mul(gate_up=blocked[:BATCH], out_dtype=out_dtype, block=32))
    with pytest.raises(ValueError, match="multiple of 2 \\* block"):
        kernels.silu_mul(gate_up=blocked[:, :160], out_dtype=out_dtype, block=32)


def test_a_gemm_that_applies_silu_mul_gives_the_two_launches_bits():
    """``gemm.swiglu``: the gate | up gemm with SiLU(gate) * up in its tile's epilogue, by address and by descriptor,
    against the gemm then ``silu_mul`` (two launches) bit for bit, its padding rows zero; configurations whose tile
    does not hold a block of gate and of up (split K, another block) are refused by name, and ``fuses_swiglu``
    says which do."""
    gen = torch.Generator().manual_seed(7)
    weight = (randn(256, 64, gen=gen) / 8).to(torch.float16)  # gate | up of 128 columns in blocks of 32
    x = torch.zeros(32, 64, dtype=torch.float16)
    x[:18] = randn(18, 64, gen=gen).to(torch.float16)
    for config in (gemm.GemmConfig(64, 32, swap=True), gemm.GemmConfig(64, 16, swap=True, tma=True)):
        assert gemm.fuses_swiglu(config, weight, 32)
        got = gemm.swiglu(x, weight, rows=18, config=config, block=32, out_dtype=torch.float16)
        two = kernels.silu_mul(gate_up=gemm.linear(x, weight, rows=18, config=config), out_dtype=torch.float16,
                               live=18, block=32)
        assert got.shape == (32, 128) and torch.equal(got, two) and not got[18:].any(), config
    for config, block in ((gemm.GemmConfig(64, 16, split_k=2, swap=True), 32), (gemm.GemmConfig(64, 32, swap=True), 16),
                          (gemm.GemmConfig(64, 32), 32)):
        assert not gemm.fuses_swiglu(config, weight, block)
        with pytest.raises(ValueError, match="swiglu applies"):
            gemm.swiglu(x, weight, rows=18, config=config, block=block, out_dtype=torch.float16)


def test_bad_shapes_are_refused():
    """A residual stream that is not float32, or rows narrower than the heads need, is an error that says so."""
    with pytest.raises(ValueError, match="float32"):
        kernels.add_rms_norm(x=torch.zeros(2, 8, dtype=torch.float16), delta=None, weight=torch.zeros(8), eps=1e-6,
                             out_dtype=torch.float16)
    with pytest.raises(ValueError, match="qkv must be"):
        kernels.qk_norm_rope(qkv=torch.zeros(2, 10), batch=2, positions=torch.zeros(2, dtype=torch.long),
                             q_weight=torch.zeros(4), k_weight=torch.zeros(4), inv_freq=torch.ones(1), eps=1e-6,
                             heads=(1, 1), head_dim=4)


@pytest.mark.parametrize("n_out, n_in", [(100, 48), (40, 256), (4200, 32)])
def test_linear_rows(n_out, n_in):
    """The decode gemm (fp16) against the float32 product: odd widths, one and two column blocks of the widest
    size, rows past the batch zero (also in a live 16-row tile), and a row's bits the same alone as in the batch."""
    gen = torch.Generator().manual_seed(7)
    weight = randn(n_out, n_in, gen=gen, dtype=torch.float16)
    x = torch.zeros(48, n_in, dtype=torch.float16)
    x[:BATCH] = randn(BATCH, n_in, gen=gen, dtype=torch.float16)
    got = gemm.linear(x, weight, rows=BATCH)
    want = (x[:BATCH].float() @ weight.float().t()).half()
    _close(got[:BATCH], want)
    assert got.shape == (48, n_out) and not got[BATCH:].any()
    alone = torch.zeros(16, n_in, dtype=torch.float16)
    alone[0] = x[1]
    assert torch.equal(gemm.linear(alone, weight, rows=1)[0], got[1])


def test_linear_refuses_what_it_cannot_tile():
    weight = torch.zeros(8, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="16-bit weight"):
        gemm.linear(torch.zeros(16, 32), weight.float(), rows=1)
    with pytest.raises(ValueError, match="multiple of 16 rows"):
        gemm.linear(torch.zeros(8, 32, dtype=torch.float16), weight, rows=1)
    with pytest.raises(ValueError, match="divisible by 16"):
        gemm.linear(torch.zeros(16, 24, dtype=torch.float16), torch.zeros(8, 24, dtype=torch.float16), rows=1)


def test_every_gemm_configuration_computes_the_product():
    """Each candidate configuration ``gemm.choose`` may pick gives the product within fp16 rounding, and a row's bits
    the same alone as in the batch."""
    gen = torch.Generator().manual_seed(8)
    weight = randn(600, 256, gen=gen, dtype=torch.float16)
    x = torch.zeros(16, 256, dtype=torch.float16)
    x[:2] = randn(2, 256, gen=gen, dtype=torch.float16)
    want = (x[:2].float() @ weight.float().t()).half()
    candidates = gemm.configs(600, 256)
    whole = [c for c in candidates if c.split_k == 1 and not c.swap]
    assert {c.block_n for c in whole} == {16} and {c.block_k for c in whole} == {256, 128}
    assert {c.split_k for c in candidates} == {1, 2, 4}, "a narrow output also splits K"
    assert {(c.tma, c.split_k) for c in candidates if c.swap} == {(False, 1), (True, 1), (False, 4), (True, 4)}
    alone = torch.zeros(16, 256, dtype=torch.float16)
    alone[0] = x[1]
    # a programmatic dependent launch is its plain twin's kernel after a wait the interpreter has not got (the GPU
    # runs it: tests/gpu/test_decode_step_cuda.py; kernel_launches compiles it)
    assert {c._replace(pdl=False) for c in candidates if c.pdl} == {c for c in candidates if c.tma and not c.pdl}
    assert not any(c.prefetch for c in candidates), "asking for the weight early lost in the engine's step"
    for config in dict.fromkeys(c._replace(pdl=False) for c in candidates):
        got = gemm.linear(x, weight, rows=2, config=config)
        _close(got[:2], want)
        assert not got[2:].any(), config
        assert torch.equal(gemm.linear(alone, weight, rows=1, config=config)[0], got[1]), config
    with pytest.raises(ValueError, match="block_k=96"):
        gemm.linear(x, weight, rows=2, config=gemm.GemmConfig(16, 96))
    with pytest.raises(ValueError, match="needs swap=True"):
        gemm.linear(x, weight, rows=2, config=gemm.GemmConfig(16, 64, tma=True))
    with pytest.raises(ValueError, match="pdl=True .* needs swap=True"):
        gemm.linear(x, weight, rows=2, config=gemm.GemmConfig(16, 64, pdl=True))
    for config in (gemm.GemmConfig(64, 64, swap=True, tma=True, prefetch=64),  # not a dependent launch
                   gemm.GemmConfig(64, 64, swap=True, tma=True, pdl=True, prefetch=12)):  # not whole 16-byte pieces
        with pytest.raises(ValueError, match="prefetch=N .* needs pdl=True and N a positive multiple of 8"):
            gemm.linear(x, weight, rows=2, config=config)


def test_a_norm_adds_a_splits_parts_as_its_second_launch_does():
    """``linear(unsummed=True)``: a split's K parts left unsummed (``Parts``, float32, the gemm's dtype named) and
    ``add_rms_norm`` adding them: the residual and the normed rows of the summed output bit for bit, by address and
    swapped, padding rows untouched; a whole-K tile returns its output as ever. Parts that are not float32
    [split, rows, cols] are refused by name."""
    gen = torch.Generator().manual_seed(12)
    weight = randn(40, 256, gen=gen, dtype=torch.float16)
    h = torch.zeros(32, 256, dtype=torch.float16)
    h[:BATCH] = randn(BATCH, 256, gen=gen, dtype=torch.float16)
    x = torch.zeros(32, 40)
    x[:BATCH] = randn(BATCH, 40, gen=gen)
    norm = randn(40, gen=gen)
    for config in (gemm.GemmConfig(16, 32, split_k=4), gemm.GemmConfig(64, 64, split_k=2, swap=True)):
        parts = gemm.linear(h, weight, rows=BATCH, config=config, unsummed=True)
        assert isinstance(parts, kernels.Parts) and parts.dtype == torch.float16, config
        assert parts.sums.dtype == torch.float32 and parts.sums.shape == (config.split_k, 32, 40), config
        summed = gemm.linear(h, weight, rows=BATCH, config=config)
        residuals = [x.clone(), x.clone()]
        outs = [kernels.add_rms_norm(x=r, delta=d, weight=norm, eps=1e-6, out_dtype=torch.float16, live=BATCH)
                for r, d in zip(residuals, (parts, summed))]
        assert torch.equal(residuals[0], residuals[1]) and torch.equal(outs[0], outs[1]), config
        assert not residuals[0][BATCH:].any() and not outs[0][BATCH:].any(), config
    whole = gemm.linear(h, weight, rows=BATCH, config=gemm.GemmConfig(16, 32), unsummed=True)
    assert isinstance(whole, torch.Tensor) and whole.shape == (32, 40) and whole.dtype == torch.float16
    with pytest.raises(ValueError, match="a delta's parts must be float32 \\[split, 32, 40\\]"):
        kernels.add_rms_norm(x=x, delta=kernels.Parts(torch.zeros(2, 32, 40, dtype=torch.float16), torch.float16),
                             weight=norm, eps=1e-6, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="delta must be \\[32, 40\\] like x"):
        kernels.add_rms_norm(x=x, delta=kernels.Parts(torch.zeros(2, 16, 40), torch.float16), weight=norm, eps=1e-6,
                             out_dtype=torch.float16)


def test_a_fused_sum_gives_the_two_launch_splits_bits():
    """K in 4 parts added by each tile's last program in the same launch (``fused_sum``): the bits of the split whose
    parts a second launch adds (the same order), by address and by descriptor, over two live row tiles and a tile
    past the batch; every tile counter is back at zero after it (a graph replays the launch as it is)."""
    gen = torch.Generator().manual_seed(10)
    weight = randn(100, 64, gen=gen, dtype=torch.float16)
    x = torch.zeros(48, 64, dtype=torch.float16)
    x[:18] = randn(18, 64, gen=gen, dtype=torch.float16)
    for tma in (False, True):
        two = gemm.GemmConfig(64, 16, split_k=4, swap=True, tma=tma)
        got = gemm.linear(x, weight, rows=18, config=two._replace(fused_sum=True))
        assert torch.equal(got, gemm.linear(x, weight, rows=18, config=two)) and not got[18:].any(), tma
        assert not counters(1, x.device).any(), "a tile counter was left set"
    with pytest.raises(ValueError, match="needs swap=True and split_k > 1"):
        gemm.linear(x, weight, rows=18, config=gemm.GemmConfig(64, 16, swap=True, fused_sum=True))


def test_the_swapped_tile_reads_the_weights_edge_rows_as_zeros():
    """The swapped kernel on a weight whose rows end inside a block (by address, masked; by descriptor, the
    TMA's zero fill) and in a second live 16-row tile: the product within fp16 rounding, padding rows zero."""
    gen = torch.Generator().manual_seed(9)
    weight = randn(70, 64, gen=gen, dtype=torch.float16)
    x = torch.zeros(32, 64, dtype=torch.float16)
    x[:18] = randn(18, 64, gen=gen, dtype=torch.float16)
    want = (x[:18].float() @ weight.float().t()).half()
    for tma in (False, True):
        got = gemm.linear(x, weight, rows=18, config=gemm.GemmConfig(64, 16, swap=True, tma=tma, split_k=2))
        _close(got[:18], want)
        assert got.shape == (32, 70) and not got[18:].any(), tma


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_conv_gdn_rows_is_the_conv_update_then_gdn_rows(dtype):
    """One launch gives the two kernels' bits: the rows, their pending copies and each slot's advanced conv state, on
    a pool that is one layer's slice of a wider pool (as the engine's) and a projection whose columns are sliced."""
    from mini_engine.ops.causal_conv1d.triton import causal_conv1d_update

    gen = torch.Generator().manual_seed(11)
    hk, hv, dk, dv, width = 2, 4, 16, 8, 4
    conv_dim = 2 * hk * dk + hv * dv
    fused = randn(ROWS, conv_dim + 2 * hv + 3, gen=gen, dtype=dtype)  # conv input | b | a | other columns
    x, b, a = fused[:BATCH, :conv_dim], fused[:, conv_dim : conv_dim + hv], fused[:, conv_dim + hv : conv_dim + 2 * hv]
    weight = randn(conv_dim, 1, width, gen=gen)[:, 0]
    pools = randn(6, 2, conv_dim, width - 1, gen=gen)  # [slots, layers, C, W - 1]: layer 1 is the one stepped
    A_log, dt_bias = randn(hv, gen=gen), randn(hv, gen=gen)
    slots, pending_slots, pending_rows = torch.tensor([5, 1, 3]), torch.tensor([5, 0, 3]), torch.tensor([3, 62, 0])
    heads, dims = (hk, hv), (dk, dv)
    results = []
    for fuse in (False, True):
        pool = pools.clone()
        pending = torch.full((6, 63, 2 * hk * dk + hv * dv + 2 * hv), float("nan"))
        rows = dict(a=a, b=b, A_log=A_log, dt_bias=dt_bias, heads=heads, head_dims=dims, pending_pool=pending,
                    pending_slots=pending_slots, pending_rows=pending_rows)
        if fuse:
            got = gdn_kernels.conv_gdn_rows(x=x, conv_weight=weight, conv_pool=pool[:, 1], slots=slots, **rows)
        else:
            conv = causal_conv1d_update(x=x, weight=weight, conv_pool=pool[:, 1], slot_indices=slots,
                                        activation="silu").output
            got = gdn_kernels.gdn_rows(conv=conv, **rows)
        results.append((got, pool, pending))
    (want, want_pool, want_pending), (got, got_pool, got_pending) = results
    assert torch.equal(got, want)
    assert torch.equal(got_pool, want_pool) and not torch.equal(got_pool, pools)
    assert torch.equal(got_pending.nan_to_num(7.0), want_pending.nan_to_num(7.0))
    untouched = [s for s in range(6) if s not in slots.tolist()]
    assert torch.equal(got_pool[untouched], pools[untouched]) and torch.equal(got_pool[:, 0], pools[:, 0])


def test_conv_gdn_rows_refuses_a_pool_it_cannot_step():
    """A conv state pool of the wrong width or layout is an error that names the shape it needs."""
    x = torch.zeros(2, 2 * 16 + 8)
    common = dict(x=x, conv_weight=torch.zeros(40, 4), slots=torch.tensor([1, 2]), a=x[:, :1], b=x[:, 1:2],
                  A_log=torch.zeros(1), dt_bias=torch.zeros(1), heads=(1, 1), head_dims=(16, 8))
    with pytest.raises(ValueError, match=r"conv_pool must be \[slots, 40, 3\]"):
        gdn_kernels.conv_gdn_rows(conv_pool=torch.zeros(3, 40, 4), **common)
    with pytest.raises(ValueError, match="contiguous columns"):
        gdn_kernels.conv_gdn_rows(conv_pool=torch.zeros(3, 3, 40).transpose(1, 2), **common)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16], ids=str)
def test_qk_norm_rope_writes_the_pages_as_write_kv_pages(cache_dtype):
    """With the caches, the same launch stores each row's key and value where ``write_kv_pages`` would (bits equal),
    on caches that are one layer's slice of a wider pool, and nothing else in them changes."""
    from mini_engine.ops.attention.triton import write_kv_pages

    gen = torch.Generator().manual_seed(12)
    hq, hkv, d, page = 4, 2, 24, 4
    qkv = randn(ROWS, (2 * hq + 2 * hkv) * d, gen=gen)
    inv_freq = 1.0 / (10_000 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
    args = dict(qkv=qkv, batch=BATCH, positions=torch.tensor([0, 7, 4100]), q_weight=randn(d, gen=gen),
                k_weight=randn(d, gen=gen), inv_freq=inv_freq, eps=1e-6, heads=(hq, hkv), head_dim=d)
    pools = randn(9, 2, page, hkv, d, gen=gen, dtype=cache_dtype), randn(9, 2, page, hkv, d, gen=gen, dtype=cache_dtype)
    kv_rows = torch.tensor([5 * page + 3, 0 * page + 1, 8 * page + 0])
    want_k, want_v = (p.clone() for p in pools)
    q, k, v = kernels.qk_norm_rope(**args)
    write_kv_pages(k_cache=want_k[:, 1], v_cache=want_v[:, 1], k=k, v=v, slot_mapping=kv_rows)
    got_k, got_v = (p.clone() for p in pools)
    outputs = kernels.qk_norm_rope(**args, k_cache=got_k[:, 1], v_cache=got_v[:, 1], kv_rows=kv_rows)
    for got, want in zip(outputs, (q, k, v)):
        assert torch.equal(got, want)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v) and not torch.equal(got_k, pools[0])
    with pytest.raises(ValueError, match="go together"):
        kernels.qk_norm_rope(**args, k_cache=got_k[:, 1])
    with pytest.raises(ValueError, match="contiguous below the page"):
        kernels.qk_norm_rope(**args, k_cache=got_k[:, 1].transpose(1, 2), v_cache=got_v[:, 1].transpose(1, 2),
                             kv_rows=kv_rows)


@pytest.mark.parametrize("by_slot", [False, True], ids=["tokens", "token-pool"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_decode_prologue(by_slot, dtype):
    """One launch gives the reference's indices and embedded rows (bits), zero rows past the batch, tokens read
    per sequence or from a per-slot pool at the slots; the indices are the decode step's fields in order."""
    from mini_engine.model.decode import _Step
    from mini_engine.ops.decode_rows.prologue import INDEX_FIELDS, decode_prologue

    gen = torch.Generator().manual_seed(13)
    slots, positions = [4, 1, 6], [0, 63, 130]
    inputs = torch.tensor([slots, positions, [4, 0, 6]])  # the second completes its chunk: its pending slot is the sink
    table = torch.randint(1, 50, (3, 9), generator=gen, dtype=torch.int32)
    pool = torch.randint(0, 30, (8,), generator=gen)
    tokens = pool[slots] if not by_slot else pool
    args = dict(inputs=inputs, page_table=table, page_size=16, align=64, tokens=tokens,
                embedding=randn(30, 40, gen=gen, dtype=dtype), rows=8, by_slot=by_slot)
    x, index = decode_prologue(**args)
    want_x, want_index = reference.decode_prologue(**args)
    assert torch.equal(x, want_x) and torch.equal(index, want_index) and not x[3:].any()
    assert index[:, 1].tolist() == [1, 63, 63, 0, 62, 64, 16 * int(table[1, 3]) + 15]
    assert _Step._fields == INDEX_FIELDS
    with pytest.raises(ValueError, match="rows .* must hold the batch"):
        decode_prologue(**{**args, "rows": 2})
