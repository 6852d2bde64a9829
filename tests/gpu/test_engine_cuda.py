"""The engine on the cuda backend (real streams): greedy hits give the cold runs' tokens in float32,
and the aliasing fault is reproduced by its real mechanism."""

import random

import pytest

from forensics.attribute import donated_states
from forensics.divergence import divergences
from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.model import build_builtin


@pytest.fixture(scope="module")
def cuda_model():
    return build_builtin("tiny-random").cuda()


def hit_heavy(seed: int = 0) -> list[tuple[list[int], int]]:
    """36 requests over 4 shared 150-token prefixes plus 1-40 private tokens, arriving 3 per step."""
    rnd = random.Random(seed)
    prefixes = [[rnd.randrange(256) for _ in range(150)] for _ in range(4)]
    return [(rnd.choice(prefixes) + [rnd.randrange(256) for _ in range(rnd.randrange(1, 40))], i // 3)
            for i in range(36)]


def run(model, requests, **options):
    """(results, ledger rows) of the requests on a cuda engine."""
    rows = []
    engine = Engine(EngineConfig(device="cuda", **options), model=model, sink=rows.append)
    ids = [engine.submit(prompt, SamplingParams(max_tokens=6), at_step=step) for prompt, step in requests]
    engine.run()
    return [engine.result(r) for r in ids], rows


def parted(hot, cold) -> str:
    """Where each hit that differs from its cold run first parted from it (``forensics.divergence``)."""
    (hot, hot_rows), (cold, cold_rows) = hot, cold
    found = divergences(hot_rows, cold_rows, logits={h.rid: (h.logit_checks, c.logit_checks) for h, c in zip(hot, cold)})
    return "\n".join(d.describe() for d in found if d.parted)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_the_tracked_step_digests_are_the_read_back_ones_on_the_gpu(cuda_model, overlap):
    """The ledger's live-slot checksums through the memo (updated inside the step's CUDA graph) equal those read
    back whole at every step, over hits, forks and decode steps that complete a chunk (150 + 40 tokens cross 192)."""
    requests = [(prompt, step) for prompt, step in hit_heavy(seed=2)[:12]]
    written = {}
    for mode in ("tracked", "readback"):
        rows = []
        engine = Engine(EngineConfig(device="cuda", overlap=overlap, state_digests=mode), model=cuda_model,
                        sink=rows.append)
        for prompt, step in requests:
            engine.submit(prompt, SamplingParams(max_tokens=40), at_step=step)
        engine.run()
        # by request and position (a batch's makeup may follow the GPU's timing; a state's bits do not)
        written[mode] = {(r["rid"], r["position"]): r["checksum"] for r in rows if r["type"] == "slot_write"}
        assert sum(r["type"] == "restore" for r in rows) >= 6
    assert written["tracked"] == written["readback"] and len(written["tracked"]) >= 12 * 39


@pytest.mark.parametrize("decode_kernels", ["triton", "reference"])
@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_greedy_hits_give_the_cold_runs_tokens_on_the_gpu(cuda_model, overlap, decode_kernels):
    """Same greedy tokens with the cache on as off, with either decode path, and with the Triton prefill
    (the default on cuda) the same logits bits: its kernels are batch-invariant and chunk-exact, and these
    hits restore prompt prefixes a prefill computed (``benchmarks/hit_divergence.py``: 0 of 55 differed on
    the H200). The reference prefill gives only the tokens: its chunked gated delta rule is not
    batch-invariant on CUDA (``benchmarks/gpu_invariance.py``)."""
    requests = hit_heavy()
    for prefill in ("triton", "reference"):
        options = {"decode_kernels": decode_kernels, "prefill_kernels": prefill}
        hot_run = run(cuda_model, requests, overlap=overlap, **options)
        cold_run = run(cuda_model, requests, enable_cache=False, **options)
        hot, cold = hot_run[0], cold_run[0]
        assert sum(r.cached_tokens > 0 for r in hot) >= 24
        assert [r.output_ids for r in hot] == [r.output_ids for r in cold], (prefill, parted(hot_run, cold_run))
        if prefill == "triton":
            assert [r.logits_digest for r in hot] == [r.logits_digest for r in cold], parted(hot_run, cold_run)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_seeded_choices_in_one_batch_are_each_drawn_as_alone_on_the_gpu(cuda_model, overlap):
    """n=3 seeded choices decode in one batch beside a greedy request, their rows drawn on the host together
    (``ModelRunner._pick_tokens``): each choice gets the tokens of its own seeded request run alone, the greedy
    request those of its run alone, and the choices differ."""
    rnd = random.Random(5)
    prompt, greedy_prompt = [rnd.randrange(256) for _ in range(90)], [rnd.randrange(256) for _ in range(70)]
    engine = Engine(EngineConfig(device="cuda", overlap=overlap), model=cuda_model)
    rid = engine.submit(prompt, SamplingParams(max_tokens=10, temperature=0.9, seed=11), n=3)
    greedy = engine.submit(greedy_prompt, SamplingParams(max_tokens=10))
    engine.run()

    def alone(tokens, params):
        single = Engine(EngineConfig(device="cuda", overlap=overlap), model=cuda_model)
        one = single.submit(tokens, params)
        single.run()
        return single.result(one).output_ids

    choices = [engine.result(c).output_ids for c in engine.choices(rid)]
    assert choices == [alone(prompt, SamplingParams(max_tokens=10, temperature=0.9, seed=11 + i)) for i in range(3)]
    assert len(set(choices)) == 3
    assert engine.result(greedy).output_ids == alone(greedy_prompt, SamplingParams(max_tokens=10))


def test_dependent_launches_give_the_same_tokens_and_logits_on_the_gpu(cuda_model):
    """decode_pdl=True (the decode step's Triton kernels as programmatic dependent launches, in its CUDA graphs,
    overlapped with the next step's scheduling; the default on Hopper): the plain launches' tokens and logits
    digests, hits and all."""
    from mini_engine.ops import pdl

    if pdl.supported("cuda"):
        pytest.skip(pdl.supported("cuda"))
    requests = hit_heavy(1)
    plain, _ = run(cuda_model, requests, overlap=True, decode_pdl=False)
    dependent, rows = run(cuda_model, requests, overlap=True, decode_pdl=True)
    assert sum(r.cached_tokens > 0 for r in dependent) >= 24
    assert [(r.output_ids, r.logits_digest) for r in dependent] == [(r.output_ids, r.logits_digest) for r in plain]
    assert any(r["type"] == "slot_write" for r in rows)


def test_transfer_poisons_the_finish_donation_through_the_decode_in_flight(cuda_model):
    """donate=transfer, overlap, page size 1: a reply that ends on a stop token (which no scheduler can
    foresee) still has its next decode launched; that decode writes the live slot the tree now owns, so
    the next turn restores bytes other than those donated (slot checksums: exact on any device).
    Copy-on-donate restores exactly what was donated."""
    prompt = [random.Random(1).randrange(256) for _ in range(90)]
    outcome = {}
    for policy in ("copy", "transfer"):
        rows = []
        engine = Engine(EngineConfig(device="cuda", overlap=True, page_size=1, num_pages=4096, donate_policy=policy),
                        model=cuda_model, sink=rows.append)
        free = engine.result(_ran(engine, prompt, SamplingParams(max_tokens=6))).output_ids
        stop = next(t for i, t in enumerate(free) if i >= 2 and t not in free[:i])
        reply = list(free[: free.index(stop) + 1])
        first = _ran(engine, prompt, SamplingParams(max_tokens=6, stop_token_ids=(stop,)), rid="first")
        assert list(engine.result(first).output_ids) == reply
        follow = _ran(engine, prompt + reply + [7, 8, 9], SamplingParams(max_tokens=6), rid="follow")
        read, donated = next((r, d) for r, d in donated_states(rows) if r.get("rid") == follow)
        outcome[policy] = (read["position"], read["src_checksum"] == donated["checksum"])
    position = len(prompt) + len(reply) - 1  # the finish donation: prompt + reply, less the stop token
    assert outcome == {"copy": (outcome["copy"][0], True), "transfer": (position, False)}


def _ran(engine: Engine, prompt: list[int], params: SamplingParams, rid: str | None = None) -> str:
    rid = engine.submit(prompt, params, rid=rid)
    engine.run()
    return rid


def test_device_checksums_are_the_reference_digests():
    """A slot's checksum computed on the GPU (deferred, per pool, no copy) and the logits check computed on the
    device equal the reference digests of the same bytes."""
    import torch

    from mini_engine.device.cuda import CudaDevice
    from mini_engine.engine.step_ledger import CHECK_MASK, logits_checks
    from mini_engine.engine.storage import StateStorage
    from mini_engine.ops.checksum import slot_checksum
    from mini_engine.ops.checksum.deferred import DeviceDigest, DigestRows

    config = build_builtin("tiny-random").config
    states = StateStorage(config, 4, CudaDevice())
    gen = torch.Generator(device="cuda").manual_seed(3)
    for pool in (states.conv, states.rec, states.pending):
        pool.copy_(torch.randn(pool.shape, generator=gen, device="cuda"))
    cases = [(1, 64), (2, 70), (3, 127), (4, 1)]
    slots, lengths = [s for s, _ in cases], [n for _, n in cases]
    got = [*states.checksums(slots[:1], lengths[:1]), *states.checksums(slots[1:], lengths[1:])]  # alone, together
    assert all(isinstance(d, DeviceDigest) for d in got)
    for d in got:
        d.wait()
    want = [slot_checksum(states.slot_bytes(slot, length).cpu()) for slot, length in cases]
    assert DeviceDigest.resolve_all(got) == want
    # into a batch's digest rows, landing with one copy of them: the same digests, and a snapshot's copy of slot 1
    # (at 64) into slot 2 digests both ends as slot 1's
    results = torch.zeros((7, 2), dtype=torch.int64, device="cuda")
    host = torch.zeros((7, 2), dtype=torch.int64, pin_memory=True)
    copied = torch.cuda.Event()
    rows = DigestRows(results, host, copied)
    into = [*states.checksums(slots, lengths, into=rows), *states.copy_witnessed(2, 1, 64, into=rows)]
    host.copy_(results, non_blocking=True)
    copied.record()
    assert rows.taken == 6 and all(d.landing() is copied for d in into)
    into[0].wait()
    assert DeviceDigest.resolve_all(into) == [*want, want[0], want[0]]
    for vocab in (259, 20_000):  # rows of one chunk (one launch) and of three (two launches)
        logits = torch.randn(3, vocab, generator=gen, device="cuda")
        assert logits_checks(logits).tolist() == [slot_checksum(row) & CHECK_MASK for row in logits.cpu()]


def test_landed_digests_are_read_without_waiting_for_work_queued_after_them():
    """The ledger's digests land in pinned host memory behind the work that computed them (``on_host``): with a
    second of work queued on the compute stream after them, a flush reads their values while that work still runs
    (a read-back at the flush would wait for it: the host would stop running ahead of the device at every flush)."""
    import torch

    from mini_engine.ops.checksum.deferred import DeviceDigest, DeviceDigests
    from mini_engine.ops.checksum.reference import join_lanes

    first = torch.arange(8, dtype=torch.int64, device="cuda").view(4, 2) * 977
    each = DeviceDigest.each_of(first)
    values = [each[3], DeviceDigests.all_of(torch.arange(4, dtype=torch.int64, device="cuda").view(2, 2) + 5), each[0]]
    torch.cuda._sleep(1 << 31)  # about a second of GPU clock cycles, queued after the digests' copies
    later = DeviceDigest.event_now()
    for value in values:
        value.wait()  # their own events: the copies have landed
    got = DeviceDigest.resolve_all(values)
    assert not later.query(), "the read waited for the work queued after the digests"
    assert got == [join_lanes((5862, 6839)), [join_lanes((5, 6)), join_lanes((7, 8))], join_lanes((0, 977))]


def test_the_ledger_reads_device_checksums_as_ints(cuda_model):
    """With a sink on cuda every ledger row reaches it once the run ends, its checksums resolved to ints in seq
    order."""
    rows = []
    engine = Engine(EngineConfig(device="cuda", overlap=True), model=cuda_model, sink=rows.append)
    for prompt, step in hit_heavy()[:12]:
        engine.submit(prompt, SamplingParams(max_tokens=4), at_step=step)
    engine.run()
    assert engine.events.pending == 0 and [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    checked = [r for r in rows if "checksum" in r or "read_checksum" in r]
    assert checked and all(isinstance(r.get("checksum", r.get("read_checksum")), int) for r in checked)
    assert all(r["match"] is True for r in rows if r["type"] == "decode_metadata")


def copies_agree(rows: list[dict]) -> tuple[int, int]:
    """Assert that the ledger's copies agree with the states they copied: each restore's and clone's destination as
    left is its source as read, a restore reads what the clone that last filled its source left there, a decode
    snapshot is the live state at its position wherever the ledger has both. Returns (restores of a clone's slot,
    snapshots checked)."""
    copies = [r for r in rows if r["type"] in ("restore_read", "clone_written")]
    assert sum(r["type"] == "restore_read" for r in copies) >= 6
    assert all(r["checksum"] == r["src_checksum"] for r in copies)
    cloned, restored, differ = {}, 0, []  # slot -> what the last clone into it left
    for r in copies:
        if r["type"] == "clone_written":
            cloned[r["dst"]] = r["checksum"]
        elif r["src"] in cloned:
            restored += 1
            if r["src_checksum"] != cloned[r["src"]]:
                differ.append(r)
    assert not differ, f"{len(differ)} of {restored} restores read other than the clone left, the first {differ[0]}"
    live = {(r["rid"], r["position"]): r["checksum"] for r in rows if r["type"] == "slot_write"}
    snapshots = [r for r in rows if r["type"] == "snapshot_write" and (r["rid"], r["position"]) in live]
    assert all(r["checksum"] == live[r["rid"], r["position"]] for r in snapshots)
    return restored, len(snapshots)


@pytest.mark.parametrize("device_seed", [0, 1, 2], ids=["own-timing", "nemesis-1", "nemesis-2"])
def test_the_ledgers_copies_and_snapshots_agree_with_the_states_they_copied_on_the_gpu(cuda_model, device_seed):
    """On cuda the digests of restores (landing with the next forward's results), clones (rows of a block on the copy
    stream, each clone's landing with its fence) and decode snapshots (copied and digested in one launch, into the
    batch's rows) agree with the states they copied (``copies_agree``), on the GPU's own timing and under the
    nemesis (seeded spins before ops on every stream)."""
    rows = []
    engine = Engine(EngineConfig(device="cuda", overlap=True, device_seed=device_seed), model=cuda_model,
                    sink=rows.append)
    for prompt, step in hit_heavy(seed=2)[:12]:
        engine.submit(prompt, SamplingParams(max_tokens=40), at_step=step)
    engine.run()
    restored, snapshots = copies_agree(rows)
    assert restored >= 6 and snapshots >= 6  # prompts of 151-189 tokens and 40 more cross 192 in decode


@pytest.mark.parametrize("device_seed", [0, 1], ids=["own-timing", "nemesis-1"])
def test_the_ledgers_copies_agree_at_the_08b_size(device_seed):
    """``copies_agree`` at Qwen3.5-0.8B's size in bfloat16 under overlap: a forward long enough that the host builds
    the next batch while the last one's digest rows still wait for their copy to the host. With those rows made on
    the default stream (until session 28), which PyTorch's streams do not wait for, the next batch's results took
    their memory and zeroed it first: 16 to 28 of 41 restores read other than the clone left (an H100), where the
    tiny model's test above passed."""
    import torch

    from mini_engine.model.builtin import QWEN35_08B

    model = build_builtin(QWEN35_08B).cuda().cast_projections(torch.bfloat16)
    rnd = random.Random(0)
    prefixes = [[rnd.randrange(256) for _ in range(130)] for _ in range(6)]
    rows = []
    engine = Engine(EngineConfig(device="cuda", dtype="bfloat16", overlap=True, device_seed=device_seed,
                                 num_pages=48 * 15 + 64, max_running=16, num_slots=64), model=model, sink=rows.append)
    for i in range(48):
        prompt = rnd.choice(prefixes) + [rnd.randrange(256) for _ in range(rnd.randrange(1, 40))]
        engine.submit(prompt, SamplingParams(max_tokens=64), at_step=i // 2)
    engine.run()
    restored, _ = copies_agree(rows)
    assert restored >= 20
