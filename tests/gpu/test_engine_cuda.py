"""The engine on the cuda backend (real streams): hits exact against cold runs in float32, and the
aliasing fault reproduced by its real mechanism."""

import random

import pytest

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
    engine = Engine(EngineConfig(device="cuda", **options), model=model, sink=lambda row: None)
    ids = [engine.submit(prompt, SamplingParams(max_tokens=6), at_step=step) for prompt, step in requests]
    engine.run()
    return [engine.result(r) for r in ids]


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_hits_are_bit_exact_against_cold_runs_on_the_gpu(cuda_model, overlap):
    """Same tokens and the same logits digest (every logit of every step) with the cache on as off."""
    requests = hit_heavy()
    hot = run(cuda_model, requests, overlap=overlap)
    cold = run(cuda_model, requests, enable_cache=False)
    assert sum(r.cached_tokens > 0 for r in hot) >= 24
    assert [r.output_ids for r in hot] == [r.output_ids for r in cold]
    assert [r.logits_digest for r in hot] == [r.logits_digest for r in cold]


def test_transfer_poisons_the_finish_donation_through_the_decode_in_flight(cuda_model):
    """donate=transfer, overlap, page size 1: a reply that ends on a stop token (which no scheduler can
    foresee) still has its next decode launched; that decode writes the live slot the tree now owns, so
    the next turn, which restores that state, differs from its cold run. Copy-on-donate does not."""
    prompt = [random.Random(1).randrange(256) for _ in range(90)]
    outcome = {}
    for policy in ("copy", "transfer"):
        engine = Engine(EngineConfig(device="cuda", overlap=True, page_size=1, num_pages=4096, donate_policy=policy),
                        model=cuda_model, sink=lambda row: None)
        free = engine.result(_ran(engine, prompt, SamplingParams(max_tokens=6))).output_ids
        stop = next(t for i, t in enumerate(free) if i >= 2 and t not in free[:i])
        reply = list(free[: free.index(stop) + 1])
        first = _ran(engine, prompt, SamplingParams(max_tokens=6, stop_token_ids=(stop,)), rid="first")
        assert list(engine.result(first).output_ids) == reply
        follow = prompt + reply + [7, 8, 9]
        result = engine.result(_ran(engine, follow, SamplingParams(max_tokens=6)))
        cold = Engine(EngineConfig(device="cuda", enable_cache=False), model=cuda_model, sink=lambda row: None)
        reference = cold.result(_ran(cold, follow, SamplingParams(max_tokens=6)))
        outcome[policy] = (result.cached_tokens, result.logits_digest == reference.logits_digest)
    assert outcome["copy"][1] is True
    # the hit restored the finish donation (prompt + reply, less the stop token), and it was poisoned
    assert outcome["transfer"] == (len(prompt) + len(reply) - 1, False)


def _ran(engine: Engine, prompt: list[int], params: SamplingParams, rid: str | None = None) -> str:
    rid = engine.submit(prompt, params, rid=rid)
    engine.run()
    return rid
