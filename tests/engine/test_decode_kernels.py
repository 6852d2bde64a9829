"""The engine with ``decode_kernels="triton"`` (decode steps on the pools through the Triton kernels, in the
interpreter here) or ``prefill_kernels="triton"`` (HybridModel.forward's sequence ops and projections through them) against
the references: same greedy tokens, cold and on hits, and the safeguards' ledger still sees every write."""

import random

import pytest

from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.model.decode import DecodeGraphs
from mini_engine.ops.decode_rows.gdn_step import gdn_step


def _conversation(config: EngineConfig, model, rows=None, prepare=None) -> list[list[int]]:
    """A prompt that decodes across a 64-boundary, then a follow-up turn and a repeat that hit (and a sampled
    request beside them). ``prepare(engine)``: called before anything is submitted."""
    rng = random.Random(3)
    prompt = [rng.randrange(256) for _ in range(58)]
    engine = Engine(config, model=model, sink=rows.append if rows is not None else None)
    if prepare is not None:
        prepare(engine)
    first = engine.submit(prompt, SamplingParams(max_tokens=8))
    engine.run()
    reply = engine.result(first).output_ids
    follow = prompt + list(reply) + [rng.randrange(256) for _ in range(9)]
    rids = [engine.submit(follow, SamplingParams(max_tokens=4)), engine.submit(prompt, SamplingParams(max_tokens=8)),
            engine.submit(follow[:70], SamplingParams(max_tokens=4, temperature=0.8, seed=4))]
    engine.run()
    return [list(reply)] + [list(engine.result(r).output_ids) for r in rids]


@pytest.fixture(scope="module")
def runs(tiny_model):
    """(reference tokens, triton tokens, triton ledger rows) per overlap setting."""
    out = {}
    for overlap in (False, True):
        rows = []
        # max_context 512: the decode attention's split grid spans the page table (2 splits, not 16)
        out[overlap] = (_conversation(EngineConfig(overlap=overlap, max_context=512), tiny_model),
                        _conversation(EngineConfig(overlap=overlap, max_context=512, decode_kernels="triton"),
                                      tiny_model, rows), rows)
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_triton_decode_gives_the_reference_tokens(runs, overlap):
    want, got, rows = runs[overlap]
    assert got == want
    assert got[2] == got[0], "the repeat (a hit) decodes what the cold run decoded"
    hits = [r for r in rows if r["type"] == "restore"]
    writes = [r for r in rows if r["type"] == "slot_write"]
    assert hits and len(writes) >= sum(map(len, got)), "every decode step is in the ledger"


def test_the_graphed_decodes_results_are_the_eager_decodes(runs, tiny_model):
    """The decode path a CUDA graph takes (``ModelRunner._decode_graphed``: the step picks the greedy tokens and
    stores them as the slots' next tokens, a sampled item's token is drawn over its row, and the step's results
    block reaches the batch's rows in one copy, or row by row when prefill items come first), run here through
    ``DecodeGraphs``' eager step (no graph kept), under overlap: the tokens of the eager decode, both ways of copying
    taken (a long prompt submitted first still prefills, first in its batches, while the conversation's first turn
    decodes)."""
    taken = []

    def prepare(engine):
        rng = random.Random(8)
        engine.submit([rng.randrange(256) for _ in range(300)], SamplingParams(max_tokens=1))
        runner = engine.runner
        runner.graphs = DecodeGraphs(runner.decode_model, runner.pools, runner.states.next_token, max_graphs=0)
        graphed = runner._decode_graphed

        def spy(batch, indices, items, *rest):
            taken.append(indices == list(range(len(items))))
            graphed(batch, indices, items, *rest)

        runner._decode_graphed = spy

    config = EngineConfig(overlap=True, max_context=512, decode_kernels="triton")
    assert _conversation(config, tiny_model, prepare=prepare) == runs[True][1]
    assert True in taken and False in taken, "one copy of a step's block, and rows copied to their places"


def test_a_decode_steps_rows_are_the_reference_decodes_rows(runs, tiny_model):
    """The triton decode's ledger rows (a step's made together, ``ModelRunner._report_step``) are the reference
    decode's (one ``emit`` a row, ``_report_writes``): the same rows in the same order, field for field in the same
    order, with the same values but the checksums (the two decodes' bits differ) and the seqs (the reference's
    snapshot rows come between its step's rows)."""
    rows = []
    assert _conversation(EngineConfig(max_context=512), tiny_model, rows) == runs[False][0]

    def decode_rows(ledger):
        return [{k: v if "checksum" not in k and k != "seq" else None for k, v in r.items()}
                for r in ledger if r["type"] in ("slot_write", "decode_metadata")]

    reference, triton = decode_rows(rows), decode_rows(runs[False][2])
    assert [list(r) for r in triton] == [list(r) for r in reference]
    assert triton == reference and sum(r["type"] == "decode_metadata" for r in reference) >= len(runs[False][0][0])
    assert all(r["match"] for r in triton if r["type"] == "decode_metadata")


def test_the_tracked_step_digests_are_the_read_back_ones(runs, tiny_model):
    """The ledger's digests of the slots the steps wrote, through the memo (the default), are the digests of
    the slots' whole bytes read back at every step (state_digests="readback"): across the chunk the first
    reply completes, the restores and the forks; and the memo read fewer bytes."""
    tracked_rows = runs[False][2]
    rows = []
    config = EngineConfig(max_context=512, decode_kernels="triton", state_digests="readback")
    assert _conversation(config, tiny_model, rows) == runs[False][1]

    def written(ledger):
        return [(r["rid"], r["slot"], r["position"], r["checksum"]) for r in ledger if r["type"] == "slot_write"]

    assert written(rows) == written(tracked_rows) and len(written(rows)) >= sum(map(len, runs[False][1]))
    assert {r["type"] for r in rows} >= {"restore", "snapshot_write"}


def test_the_memo_reads_less_than_the_read_back(tiny_model):
    """A decode step's digest through the memo reads conv and the new row; read back, the whole state."""
    read = {}
    for mode in ("tracked", "readback"):
        engine = Engine(EngineConfig(max_context=512, decode_kernels="triton", state_digests=mode), model=tiny_model,
                        sink=lambda row: None)
        engine.submit(list(range(40)), SamplingParams(max_tokens=6))  # a prefill to 40, decode steps to 45
        engine.run()
        read[mode] = engine.states.hashed_bytes
    states = engine.states
    step = states.conv[0].nbytes + states.pending[0, :, 0].nbytes
    assert read["readback"] - read["tracked"] == sum(states.nbytes(n) - step for n in range(41, 46)) > 0


def test_triton_decode_writes_decode_crossed_snapshots(runs):
    """The first reply crosses position 64 in a decode step: the snapshot written there (after the step,
    from the live slot) is in the ledger, and the follow-up restores it."""
    rows = runs[False][2]
    assert any(r["type"] == "snapshot_write" and r["position"] == 64 for r in rows)
    assert any(r["type"] == "restore" and r.get("position") == 64 for r in rows)


@pytest.mark.parametrize(("name", "allowed"), [("decode_gemm", "'cublas', 'triton', 'auto', 'tuned'"),
                                               ("decode_gdn", "'split', 'fused', 'two'"),
                                               ("decode_split_sums", "'norm', 'gemm'"),
                                               ("decode_swiglu", "'rows', 'gemm'"),
                                               ("state_digests", "'tracked', 'readback'")])
def test_config_names_the_decode_variants(name, allowed):
    with pytest.raises(ValueError, match=f"EngineConfig.{name}='fast'; allowed: \\({allowed}\\)"):
        EngineConfig(**{name: "fast"})


def test_config_refuses_dependent_launches_off_the_gpu():
    """decode_pdl launches the triton decode's kernels on a GPU: on the sim, or with the reference decode, the
    error says what it needs (on a GPU older than Hopper the engine's construction says so: ``ops.pdl``)."""
    for options in ({}, {"device": "cuda", "decode_kernels": "reference"}):
        with pytest.raises(ValueError, match="EngineConfig.decode_pdl=True .* needs device='cuda' and "
                                             "decode_kernels 'triton' or 'auto'"):
            EngineConfig(decode_pdl=True, **options)


def test_dependent_launches_are_on_by_default_only_where_the_device_has_them(tiny_model):
    """decode_pdl=None (the default): on a Hopper GPU the decode step's kernels are dependent launches; off the GPU
    (the interpreter here) they are plain, and the engine says so rather than failing."""
    engine = Engine(EngineConfig(decode_kernels="triton"), model=tiny_model)
    assert EngineConfig().decode_pdl is None and EngineConfig().decode_gemm == "tuned"
    assert engine.runner.decode_model.pdl is False


@pytest.mark.parametrize("name", ["decode_kernels", "prefill_kernels"])
def test_config_names_the_kernels(monkeypatch, name):
    with pytest.raises(ValueError, match=f"{name}='fast'"):
        EngineConfig(**{name: "fast"})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=f"{name}='triton' on the sim needs TRITON_INTERPRET=1"):
        EngineConfig(**{name: "triton"})
    config = EngineConfig()
    assert config.decode_path == config.prefill_path == "reference" and config.bit_exact


@pytest.mark.parametrize("name", ["decode_kernels", "prefill_kernels"])
def test_triton_kernels_are_not_bit_exact(name):
    config = EngineConfig(**{name: "triton"})
    assert (config.decode_path if name == "decode_kernels" else config.prefill_path) == "triton"
    assert not config.bit_exact


def test_auto_kernels_are_triton_on_cuda():
    config = EngineConfig(device="cuda")
    assert config.decode_path == config.prefill_path == "triton"
    assert EngineConfig(device="cuda", prefill_kernels="reference").prefill_path == "reference"


def test_triton_prefill_gives_the_reference_tokens(two_layer_model):
    """Prefills (and decode steps) through HybridModel.forward with the Triton kernels: the same greedy
    tokens as the references, cold and on the hits, and the ledger sees the snapshots they wrote."""
    rows = []
    want = _conversation(EngineConfig(max_context=512), two_layer_model)
    got = _conversation(EngineConfig(max_context=512, prefill_kernels="triton"), two_layer_model, rows)
    assert got == want and got[2] == got[0]
    assert any(r["type"] == "snapshot_write" and r["position"] == 64 for r in rows)
    assert any(r["type"] == "restore" and r.get("position") == 64 for r in rows)


def test_the_one_launch_gdn_step_serves_the_split_steps_tokens(two_layer_model, monkeypatch):
    """``EngineConfig.decode_gdn="fused"`` reaches the decode step (its kernel runs): cold runs and hits give the
    split steps' tokens, and every slot the ledger checksummed holds the same bytes (the interpreter gives the two
    the same bits)."""
    from mini_engine.model import decode

    launched = []
    monkeypatch.setattr(decode, "gdn_step", lambda **kw: launched.append(1) or gdn_step(**kw))
    runs = []
    for gdn in ("split", "fused"):
        rows = []
        tokens = _conversation(EngineConfig(max_context=512, decode_kernels="triton", decode_gdn=gdn),
                               two_layer_model, rows)
        assert bool(launched) == (gdn == "fused"), gdn
        runs.append((tokens, [(r["slot"], r["position"], r["checksum"]) for r in rows if r["type"] == "slot_write"]))
    (want, want_writes), (got, got_writes) = runs
    assert got == want and got[2] == got[0]
    assert got_writes == want_writes and len(got_writes) >= sum(map(len, got))


def test_a_gemm_table_file_is_read_by_tuned_alone_and_reaches_every_weight(tmp_path, tiny_model, monkeypatch):
    """``decode_gemm_table``: a table file read in the package's place by ``decode_gemm="tuned"`` -- every 16-bit
    weight of the decode step is looked up in it; naming one with another choice, a missing file or a malformed one
    is an error naming the field, at the config."""
    import json

    from mini_engine.model import decode
    from mini_engine.model.decode import DecodeModel
    from mini_engine.ops.decode_rows import gemm, tuned

    table = {"NVIDIA H200": {"bfloat16 1024x3584": {"config": gemm.GemmConfig(64, 256)._asdict(), "us": 1.0,
                                                   "cublas_us": 2.0}}}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    assert EngineConfig(decode_gemm_table=str(path)).gemm_table() == table
    assert EngineConfig().gemm_table() is None, "None: the package's table"
    with pytest.raises(ValueError, match="decode_gemm_table is read by decode_gemm='tuned' alone; got "
                                         "decode_gemm='cublas'"):
        EngineConfig(decode_gemm="cublas", decode_gemm_table=str(path))
    with pytest.raises(ValueError, match="EngineConfig.decode_gemm_table=.*absent.json.*: no such file"):
        EngineConfig(decode_gemm_table=str(tmp_path / "absent.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"NVIDIA H200": {"bfloat16 8x8": {"us": 1.0}}}))
    with pytest.raises(ValueError, match="EngineConfig.decode_gemm_table: .*bad.json: not a decode gemm table"):
        EngineConfig(decode_gemm_table=str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="read by gemm='tuned' alone"):
        DecodeModel(tiny_model, gemm="auto", gemm_table=table)

    asked = []  # (weight shape, the table it was looked up in) for each 16-bit weight
    monkeypatch.setattr(decode.tuned_gemms, "tuned",
                        lambda weight, given=None: asked.append((tuple(weight.shape), given)))
    engine = Engine(EngineConfig(decode_kernels="triton", dtype="bfloat16", decode_gemm_table=str(path)),
                    model=tiny_model)
    weights = engine.runner.decode_model.projections()
    assert [shape for shape, _ in asked] == [tuple(w.shape) for w in weights], "every projection looked up"
    assert all(given == table for _, given in asked), "in the file's table"
    asked.clear()
    Engine(EngineConfig(decode_kernels="triton", dtype="bfloat16"), model=tiny_model)
    assert asked and all(given is None for _, given in asked), "without a file: the package's"
    assert tuned.tuned(weights[0], table) is None, "a CPU weight: cuBLAS whatever the table says"
