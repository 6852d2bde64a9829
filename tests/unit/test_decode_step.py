"""``decode_step`` (Triton kernels on the pools, in place) against ``HybridModel.forward`` (the specification).

Sequences sit at lengths on both sides of a 64-boundary, so one step both appends pending rows and
completes chunks; the pools must afterwards hold exactly what the runner would have written from the
model's returned states, and nothing may land outside the slots and pages the step names.
"""

import copy

import pytest
import torch

from mini_engine.constants import GDN_STEPS
from mini_engine.device.sim import SimDevice
from mini_engine.engine.storage import KVStorage, StateStorage
from mini_engine.model.decode import SINK, DecodeModel, Pools, decode_step

PAGE = 4
LENGTHS = (5, 63, 127, 64, 1, 300)  # 63 and 127 complete a chunk with this token; 300 needs five attention splits
SLOTS = (3, 1, 6, 2, 5, 7)
ALONE = 0  # the sequence also decoded alone, on a copy of the pools


def _prefill(model, states, kv, tables, rng):
    cold = []
    for length, slot, table in zip(LENGTHS, SLOTS, tables):
        tokens = torch.randint(0, model.config.vocab_size, (length,), generator=rng)
        out = model([tokens], [model.new_state()])[0]
        states.write(slot, out.state)
        kv.scatter(table, 0, out.state.keys, out.state.values)
        cold.append(out.state)
    return cold


def build(model, device, gemm: str = "cublas"):
    """Prefill every sequence with the model into pools on ``device``, then one ``decode_step`` for all, one
    for sequence ALONE on a copy of the pools, and the model's own decode step from the cold states."""
    rng = torch.Generator().manual_seed(5)
    states = StateStorage(model.config, 8, device)
    kv = KVStorage(model.config, 512, PAGE, device)
    # interleaved, non-contiguous page tables: sequence b owns pages b+1, b+1+6, ...
    tables = [[1 + b + 6 * i for i in range(-(-(length + 1) // PAGE))] for b, length in enumerate(LENGTHS)]
    cold = _prefill(model, states, kv, tables, rng)
    width = max(map(len, tables))
    dev = states.conv.device
    page_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=dev)
    tokens = torch.randint(0, model.config.vocab_size, (len(LENGTHS),), generator=rng).to(dev)
    pools = Pools(states.conv, states.rec, states.pending, kv.keys, kv.values)
    before = [t.clone() for t in pools[:5]]
    fused = DecodeModel(model, gemm=gemm)
    alone = decode_step(fused, Pools(*(t.clone() for t in before)), tokens[ALONE : ALONE + 1], [SLOTS[ALONE]],
                        [LENGTHS[ALONE]], page_table[ALONE : ALONE + 1, : len(tables[ALONE])].contiguous())
    logits = decode_step(fused, pools, tokens, list(SLOTS), list(LENGTHS), page_table)
    want = model([t.reshape(1) for t in tokens], cold)
    return states, kv, tables, before, logits, want, alone


@pytest.fixture(scope="module")
def setup(tiny_model):
    return build(tiny_model, SimDevice())


def test_logits_match_the_model_forward(setup):
    _, _, _, _, logits, want, _ = setup
    torch.testing.assert_close(logits, torch.cat([w.logits for w in want]), rtol=1e-4, atol=1e-5)


def test_slots_hold_the_advanced_states(setup):
    states, _, _, _, _, want, _ = setup
    # (each layer's inputs went through the earlier layers' kernels: a few ulps, grown layer by layer)
    for slot, w in zip(SLOTS, want):
        conv, rec, pending = states.read(slot, w.state.length)
        torch.testing.assert_close(conv, w.state.conv, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(rec, w.state.rec, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(pending, w.state.pending, rtol=1e-4, atol=1e-5)
    assert {w.state.length % 64 for w in want} >= {0, 6}, "the step must both complete and extend chunks"


def test_pages_hold_the_new_keys_and_values(setup):
    _, kv, tables, _, _, want, _ = setup
    for table, w in zip(tables, want):
        keys, values = kv.gather(table, w.state.length)
        # the new K/V come from hidden states that went through the other kernels' arithmetic
        torch.testing.assert_close(keys, w.state.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(values, w.state.values, rtol=1e-4, atol=1e-5)


def test_nothing_outside_the_named_slots_and_pages_changes(setup):
    states, kv, tables, before, _, _, _ = setup
    untouched = [s for s in range(states.conv.shape[0]) if s not in SLOTS and s != SINK]
    for now, then in zip((states.conv, states.rec, states.pending), before[:3]):
        assert torch.equal(now[untouched], then[untouched])
    used = {p for t in tables for p in t}
    free = [p for p in range(kv.keys.shape[0]) if p not in used]
    assert torch.equal(kv.keys[free], before[3][free]) and torch.equal(kv.values[free], before[4][free])


def test_a_sequence_gets_the_same_bits_alone_as_in_a_batch(setup):
    """Batch invariance: the sequence decoded alone (one attention split, a narrower page table, a batch
    of one) gets bit for bit the logits it gets next to five others."""
    _, _, _, _, logits, _, alone = setup
    assert torch.equal(alone[0], logits[ALONE])


def _prefilled(model, device, steps: int) -> tuple[StateStorage, Pools, torch.Tensor]:
    """Every sequence prefilled into pools with the running copy, pages for ``steps`` more tokens each: the storage,
    its pools and the page table [B, pages] on the device."""
    states = StateStorage(model.config, 8, device, running=True)
    kv = KVStorage(model.config, 512, PAGE, device)
    tables = [[1 + b + 6 * i for i in range(-(-(length + steps) // PAGE))] for b, length in enumerate(LENGTHS)]
    _prefill(model, states, kv, tables, torch.Generator().manual_seed(5))
    width = max(map(len, tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=states.conv.device)
    return states, Pools(states.conv, states.rec, states.pending, kv.keys, kv.values, states.run, states.run_rows), table


def check_step_digests(model, device, steps: int) -> None:
    """``DecodeGraphs(after=step_ledger.step_digests)``, the slot ledger's digests of each decode step computed with it
    (on a GPU captured in its graph and replayed): at every step the results block holds each sequence's greedy
    token (also its slot's next token) and its logits' check, then the digests of the state each slot was left
    with and of the page-table row the step read cut to the sequence's page count, each the reference digest of
    those bytes. ``after`` gets the step's inputs with the page counts as a fourth row, and a call without them is
    refused before anything runs."""
    from mini_engine.engine.step_ledger import CHECK_MASK, step_digests
    from mini_engine.model.decode import DecodeGraphs
    from mini_engine.ops.checksum import slot_checksum
    from mini_engine.ops.checksum.triton import digests

    states, pools, table = _prefilled(model, device, steps)
    counts = [int(row.count_nonzero()) for row in table.cpu()]  # the pages are 1 + b + 6 i: never 0
    assert len(set(counts)) > 1 and min(counts) < table.shape[1], "rows cut at different widths"
    seen = []

    def after(inputs, page_table, logits):
        seen.append(inputs[3])
        return step_digests(states, inputs, page_table, logits)

    graphs = DecodeGraphs(DecodeModel(model), pools, states.next_token, after=after)
    with pytest.raises(ValueError, match="needs one extra int per sequence"):
        graphs(list(SLOTS), list(LENGTHS), table)
    for step in range(steps):
        positions = [n + step for n in LENGTHS]
        logits, results = graphs(list(SLOTS), positions, table, counts)
        n = len(SLOTS)
        assert results.shape == (3 * n, 2) and results.dtype == torch.long
        greedy = logits.argmax(-1)
        assert torch.equal(results[:n, 0], greedy) and torch.equal(states.next_token[list(SLOTS)], greedy), step
        assert results[:n, 1].tolist() == [slot_checksum(row) & CHECK_MASK for row in logits.cpu()], step
        assert digests(results[n: 2 * n]) == [slot_checksum(states.slot_bytes(s, p + 1).cpu())
                                              for s, p in zip(SLOTS, positions)]
        assert digests(results[2 * n:]) == [slot_checksum(row[:c]) for row, c in zip(table.cpu(), counts)]
    assert seen and all(s.tolist() == counts for s in seen), "the page counts as the fourth row"


def test_the_ledgers_step_digests_are_the_reference_digests(tiny_model):
    check_step_digests(tiny_model, SimDevice(), steps=1)


def check_running_copy(model, device, steps: int = 2) -> None:
    """``steps`` decode steps on pools with the running copy against the same steps replaying every time:
    the same logits and pools bit for bit; the memo counts the rows it follows (-1 once a chunk completes);
    any other write to a slot drops its memo."""
    states, running, table = _prefilled(model, device, steps)
    dev = table.device
    replaying = Pools(*(t.clone() for t in running[:5]))
    assert (states.run_rows == -1).all(), "a prefilled slot has no memo"
    fused, gen = DecodeModel(model), torch.Generator().manual_seed(9)
    for step in range(steps):
        positions = [length + step for length in LENGTHS]
        tokens = torch.randint(0, model.config.vocab_size, (len(SLOTS),), generator=gen).to(dev)
        want = decode_step(fused, replaying, tokens, list(SLOTS), positions, table)
        got = decode_step(fused, running, tokens, list(SLOTS), positions, table)
        assert torch.equal(got, want), f"step {step}"
    for name, a, b in zip(Pools._fields, running[:5], replaying):
        assert torch.equal(a[1:], b[1:]), name  # slot/page 0 is the sink
    for slot, length in zip(SLOTS, LENGTHS):
        end = length + steps  # the memo follows the rows since the boundary unless the last step completed it
        expect = -1 if end % 64 == 0 else end % 64
        # (the entry of the parity the next step reads)
        assert (states.run_rows[slot, :, end % 2] == expect).all(), (slot, states.run_rows[slot].tolist(), expect)
    live = SLOTS[0]
    states.copy_slot(SLOTS[1], live, LENGTHS[0] + steps)
    assert (states.run_rows[SLOTS[1]] == -1).all() and (states.run_rows[live, :, (LENGTHS[0] + steps) % 2] > 0).all()
    states.clear_slot(live)
    assert (states.run_rows[live] == -1).all()


def test_the_running_copy_gives_the_replays_bits(tiny_model):
    check_running_copy(tiny_model, SimDevice())


def _decoded(model, device, decoder: DecodeModel, steps: int) -> tuple[list[torch.Tensor], Pools]:
    """``steps`` decode steps of every sequence (seeded tokens) with ``decoder`` on freshly prefilled pools: each
    step's logits, and the pools after."""
    _, pools, table = _prefilled(model, device, steps)
    gen = torch.Generator().manual_seed(9)
    logits = [decode_step(decoder, pools, torch.randint(0, model.config.vocab_size, (len(SLOTS),),
                                                        generator=gen).to(table.device),
                          list(SLOTS), [length + step for length in LENGTHS], table) for step in range(steps)]
    return logits, pools


def check_gdn_step_variants(model, device, *, exact: tuple[str, ...], steps: int = 2) -> None:
    """``steps`` decode steps with each GDN layer's conv, replay and norm in one launch (``DecodeModel(gdn="fused")``)
    and with the replay and norm in one ("two") against the three launches ("split"): the logits and every pool
    (running copies and their counts too) bit for bit for the variants in ``exact``, to rounding for the others (the
    fused step on a GPU), through chunk completions and running copies."""
    want, want_pools = _decoded(model, device, DecodeModel(model, gdn="split"), steps)
    for gdn in GDN_STEPS[1:]:
        got, got_pools = _decoded(model, device, DecodeModel(model, gdn=gdn), steps)
        for step, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b) if gdn in exact else torch.allclose(a, b, rtol=1e-3, atol=1e-4), (gdn, step)
        for name, a, b in zip(Pools._fields, got_pools, want_pools):
            same = torch.equal(a[1:], b[1:]) if gdn in exact or not a.is_floating_point() else \
                torch.allclose(a[1:], b[1:], rtol=1e-4, atol=1e-5)
            assert same, (gdn, name)  # slot/page 0 is the sink


def test_the_gdn_steps_in_one_or_two_launches_give_the_split_steps_bits(two_layer_model):
    check_gdn_step_variants(two_layer_model, SimDevice(), exact=("fused", "two"))


def _spied(model, device, decoder: DecodeModel, steps: int, name: str, seen) -> tuple[list, Pools, list]:
    """``_decoded`` with the decode step's row kernel ``name`` spied on: each call's ``seen(**kwargs)`` noted."""
    from mini_engine.ops.decode_rows import triton as row_ops

    kernel, noted = getattr(row_ops, name), []

    def spy(**kwargs):
        noted.append(seen(**kwargs))
        return kernel(**kwargs)

    setattr(row_ops, name, spy)
    try:
        return (*_decoded(model, device, decoder, steps), noted)
    finally:
        setattr(row_ops, name, kernel)


def _same_bits(got: list, got_pools: Pools, want: list, want_pools: Pools) -> None:
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"step {step}"
    for name, a, b in zip(Pools._fields, got_pools, want_pools):
        assert torch.equal(a[1:], b[1:]), name  # slot/page 0 is the sink: what lands there is nobody's (and races)


def check_split_sums(model, device, *, steps: int = 2, down=None, dependent: bool = False) -> None:
    """``steps`` decode steps of a 16-bit ``model`` whose output projections split K in 2 parts (by address) and
    down projections in 4 (``down``: default the swapped tile by address), their parts added by the residual's norm
    (``DecodeModel(split_sums="norm")``) against added by the gemm's second launch ("gemm"), the step's kernels as
    dependent launches or not: the logits and every pool bit for bit, and only "norm" hands the norm a projection's
    parts (every norm but the first layer's input norm gets a mixer's or a down projection's)."""
    from mini_engine.ops.decode_rows import gemm
    from mini_engine.ops.decode_rows import triton as row_ops

    splits = {"mixer": gemm.GemmConfig(16, 16, split_k=2),
              "down": down or gemm.GemmConfig(64, 32, split_k=4, swap=True)}
    runs = []
    for sums in ("norm", "gemm"):
        decoder = DecodeModel(model, gemm="triton", split_sums=sums, pdl=dependent)
        deltas = decoder.deltas()  # per layer its mixer's output projection, then its down projection
        for weight, config in zip(deltas, [splits["mixer"], splits["down"]] * (len(deltas) // 2)):
            decoder._gemms[id(weight)] = config
        runs.append(_spied(model, device, decoder, steps, "add_rms_norm",
                           lambda *, delta, **_: isinstance(delta, row_ops.Parts)))
    (got, got_pools, parts), (want, want_pools, summed) = runs
    layers = len(model.model.layers)
    assert parts == ([False] + [True, True] * layers) * steps, "every mixer and down projection's parts to the norm"
    assert not any(summed)
    _same_bits(got, got_pools, want, want_pools)


def test_a_split_gemms_parts_added_by_the_norm_give_the_second_launchs_bits(two_layer_model):
    check_split_sums(copy.deepcopy(two_layer_model).cast_projections(torch.float16), SimDevice())


def check_swiglu(model, device, *, steps: int = 2, config=None, dependent: bool = False) -> None:
    """``steps`` decode steps of a 16-bit ``model`` whose gate | up projections run the swapped tile (``config``;
    default by address), SiLU(gate) * up in that gemm's launch (``DecodeModel(swiglu="gemm")``) against in
    ``silu_mul``'s ("rows"), the step's kernels as dependent launches or not: the logits and every pool bit for bit,
    and ``silu_mul`` launched by "rows" alone, once a layer and step."""
    from mini_engine.ops.decode_rows import gemm

    config = config or gemm.GemmConfig(64, 32, swap=True)
    runs = []
    for swiglu in ("gemm", "rows"):
        decoder = DecodeModel(model, gemm="triton", swiglu=swiglu, pdl=dependent)
        for weights in decoder.layers:
            assert weights.block == 32 and gemm.fuses_swiglu(config, weights.gate_up, weights.block)
            decoder._gemms[id(weights.gate_up)] = config
        runs.append(_spied(model, device, decoder, steps, "silu_mul", lambda **_: True))
    (got, got_pools, fused), (want, want_pools, launched) = runs
    assert not fused and len(launched) == len(model.model.layers) * steps
    _same_bits(got, got_pools, want, want_pools)


def test_silu_mul_in_the_gate_up_gemms_launch_gives_its_own_launchs_bits(two_layer_model):
    check_swiglu(copy.deepcopy(two_layer_model).cast_projections(torch.float16), SimDevice())


def test_bad_slots_are_refused(tiny_model):
    pools = Pools(*(torch.zeros(1) for _ in range(5)))
    with pytest.raises(ValueError, match="distinct live slots"):
        decode_step(DecodeModel(tiny_model), pools, torch.zeros(2, dtype=torch.long), [SINK, 1], [3, 3],
                    torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="one slot, position, token"):
        decode_step(DecodeModel(tiny_model), pools, torch.zeros(1, dtype=torch.long), [1, 2], [3, 3],
                    torch.zeros(2, 1, dtype=torch.int32))


def test_a_step_reading_its_tokens_from_the_slot_pool_gets_the_same_bits(setup, tiny_model):
    """``DecodeGraphs``' first step of a size runs eagerly and reads each sequence's token from the per-slot pool in
    the prologue (no gather launch): the logits and pools are ``decode_step``'s on the same tokens, bit for bit, and
    the greedy tokens it picked are in its results and the pool."""
    from mini_engine.model.decode import DecodeGraphs

    _, _, tables, before, _, _, _ = setup
    width = max(map(len, tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    pool = torch.randint(0, tiny_model.config.vocab_size, (8,), generator=torch.Generator().manual_seed(17))
    fused = DecodeModel(tiny_model)
    given, pooled = (Pools(*(t.clone() for t in before)) for _ in range(2))
    want = decode_step(fused, given, pool[list(SLOTS)], list(SLOTS), list(LENGTHS), table)
    got, results = DecodeGraphs(fused, pooled, pool)(list(SLOTS), list(LENGTHS), table)
    assert torch.equal(got, want)
    # without ``after`` the results block is the greedy tokens (stored as the slots' next tokens) and zero checks
    greedy = want.argmax(-1)
    assert torch.equal(results, torch.stack([greedy, torch.zeros_like(greedy)], 1))
    assert torch.equal(pool[list(SLOTS)], greedy)
    for name, a, b in zip(Pools._fields, pooled[:5], given[:5]):
        assert torch.equal(a[1:], b[1:]), name  # slot/page 0 is the sink
    with pytest.raises(ValueError, match="page table has 1 columns"):
        decode_step(fused, given, pool[:1], [SLOTS[0]], [PAGE], table[:1, :1])
