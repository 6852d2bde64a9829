"""Small fixed schedules that expose one fault each, and the machinery to run and judge them.

A schedule is a function of a seed returning ``Submit``s; ``run`` executes it on a fresh engine
(optionally with faults) and ``wrong_hits`` compares every hit with the same request run cold and
alone (cache off), which in the exact float32 configuration is the ground truth.
"""

import random
from dataclasses import dataclass, field

from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.engine.request import Status


@dataclass(frozen=True)
class Submit:
    rid: str
    prompt: tuple[int, ...]
    params: SamplingParams
    at_step: int = 0
    n: int = 1
    media: tuple[bytes, ...] = ()


@dataclass
class Run:
    engine: Engine
    events: list[dict] = field(default_factory=list)

    def of(self, type_: str, **match) -> list[dict]:
        return [e for e in self.events if e["type"] == type_ and all(e.get(k) == v for k, v in match.items())]


def tokens(rnd: random.Random, n: int) -> list[int]:
    return [rnd.randrange(256) for _ in range(n)]


def run(model, schedule: list[Submit], *, faults=(), seed=0, prepare=None, **config) -> Run:
    """Run ``schedule`` to idle and drain the device; ``prepare(engine)`` may instrument it first."""
    result = Run(None)
    engine = Engine(EngineConfig(device_seed=seed, faults=faults, **config), model=model, sink=result.events.append)
    result.engine = engine
    if prepare is not None:
        prepare(engine)
    for s in schedule:
        engine.submit(list(s.prompt), s.params, rid=s.rid, at_step=s.at_step, n=s.n, media=s.media)
    engine.run()
    engine.device.synchronize()
    return result


class ColdReference:
    """Outputs of requests run cold and alone on a cache-off engine (memoised)."""

    def __init__(self, model) -> None:
        self.model, self._memo = model, {}

    def __call__(self, prompt, params: SamplingParams, media=()) -> tuple[int, ...]:
        key = (tuple(prompt), params, tuple(media))
        if key not in self._memo:
            engine = Engine(EngineConfig(enable_cache=False), model=self.model)
            rid = engine.submit(list(prompt), params, media=media)
            engine.run()
            self._memo[key] = engine.result(rid).output_ids
        return self._memo[key]


def wrong_hits(result: Run, cold: ColdReference) -> list[str]:
    """Finished requests that hit the cache (or forked from a sibling) and differ from their cold run."""
    wrong = []
    for rid, request in result.engine.requests.items():
        forked = "#" in rid
        if request.status is not Status.FINISHED or not (request.cached_len or forked):
            continue
        if result.engine.result(rid).output_ids != cold(request.prompt, request.params, request.media):
            wrong.append(rid)
    return wrong


def all_exact(result: Run, cold: ColdReference) -> bool:
    return all(result.engine.result(rid).output_ids == cold(r.prompt, r.params, r.media)
               for rid, r in result.engine.requests.items() if r.status is Status.FINISHED)


# -- the schedules ------------------------------------------------------------------------------

def donations_then_hits(seed: int, bases: int = 8) -> list[Submit]:
    """Each of several 130-token prefixes is donated (snapshot at 128) and hit at the very next step."""
    rnd, params, plan = random.Random(seed), SamplingParams(max_tokens=3), []
    for b in range(bases):
        base = tokens(rnd, 130)
        plan.append(Submit(f"w{b}", tuple(base + tokens(rnd, 3)), params, at_step=3 * b))
        plan.append(Submit(f"h{b}", tuple(base + tokens(rnd, 4)), params, at_step=3 * b + 1))
    return plan


def finish_at_page_boundary(seed: int, first: tuple[int, ...]) -> list[Submit]:
    """A request that stops after 4 tokens (48 = a page boundary computed); a follow-up extends it."""
    rnd = random.Random(seed)
    prompt = tokens(rnd, 44)
    return [Submit("a", tuple(prompt), SamplingParams(max_tokens=10, stop_token_ids=(first[4],))),
            Submit("b", tuple(prompt) + first[:4] + tuple(tokens(rnd, 5)), SamplingParams(max_tokens=6),
                   at_step=40)]


def donate_then_hit_later(seed: int) -> list[Submit]:
    """A request dirties the slots, then a 130-token prefix is donated and hit once everything is quiet."""
    rnd, params = random.Random(seed), SamplingParams(max_tokens=5)
    base = tokens(rnd, 130)
    return [Submit("p", tuple(tokens(rnd, 90)), params),
            Submit("a", tuple(base + tokens(rnd, 3)), params, at_step=30),
            Submit("b", tuple(base + tokens(rnd, 5)), params, at_step=60)]


def hit_and_newcomer_under_slot_pressure(seed: int) -> list[Submit]:
    """With slots for two requests and one snapshot, a hit and a cold newcomer are admitted together."""
    rnd, params = random.Random(seed), SamplingParams(max_tokens=5)
    base = tokens(rnd, 130)
    return [Submit("w", tuple(base + tokens(rnd, 3)), params),
            Submit("a", tuple(base + tokens(rnd, 5)), params, at_step=20),
            Submit("b", tuple(tokens(rnd, 40)), params, at_step=20)]


def sampled_choices(seed: int) -> list[Submit]:
    """A warm-up donates the prefix, then n=3 sampled choices fork with a shared, partial last page."""
    rnd = random.Random(seed)
    prompt = tokens(rnd, 146)  # the fork at 145 shares page 9 (positions 144..159), one row filled
    return [Submit("warm", tuple(prompt[:140]), SamplingParams(max_tokens=2)),
            Submit("a", tuple(prompt), SamplingParams(max_tokens=12, temperature=1.0, seed=seed), at_step=20, n=3)]


def media_a_then_b(seed: int) -> list[Submit]:
    """Identical tokens, different media: the media placeholder sits inside the first 64-token chunk."""
    rnd, params = random.Random(seed), SamplingParams(max_tokens=6)
    prompt = tuple(tokens(rnd, 60) + [259] + tokens(rnd, 6))  # 259 = <|media|>
    a, b = bytes(tokens(rnd, 32)), bytes(tokens(rnd, 32))
    return [Submit("a", prompt, params, media=(a,)), Submit("b", prompt, params, at_step=20, media=(b,))]

