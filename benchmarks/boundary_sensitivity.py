"""How much a reply boundary's state matters to a model's answers: why ``donate=transfer`` poisons
hits that ground truth cannot see.

Under ``donate=transfer`` the tree takes a finished request's live slot while the decode built before
the finish is still in flight; that decode feeds the last sampled token into the slot. The poison is
one token, in the linear layers' state only, at the very end of the donated prefix. Two measurements,
one process, one model:

1. *insertion* (cache off, every request cold): an arithmetic reply, then ``k`` extra tokens (the
   reply-ending token, then printable bytes), then the next question. Every layer sees the extra
   tokens, which is more than the alias does; wrong answers per ``k``.
2. *the alias itself* (overlap on, page size 1, so every finish donates): a reply cut after ``cut``
   tokens by ``max_tokens``, then a request that continues exactly that text and so restores the
   finish-donated state, duplicated last token included, one token before the answer's next digit.
   Under ``copy`` and ``transfer``: hits at the finish-donated length, answers whose tokens differ from
   the cold twin's, and wrong answers.

Usage: ``python benchmarks/boundary_sensitivity.py [--model probe-tiny] [--count 60] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.model import load_model
from mini_engine.model.tokenizer import ByteTokenizer
from probes.extract import first_number
from probes.families.arithmetic import PREAMBLE, question

TOKENIZER = ByteTokenizer()
STOP = tuple(TOKENIZER.eos_token_ids)


def answer_of(engine: Engine, ids: list[int], max_tokens: int = 8,
              stop: tuple[int, ...] = STOP) -> tuple[list[int], int]:
    """The reply's tokens (reply-ending tokens dropped) and how many prompt tokens came from the cache."""
    rid = engine.submit(ids, SamplingParams(max_tokens=max_tokens, stop_token_ids=stop))
    engine.run()
    result = engine.result(rid)
    return [t for t in result.output_ids if t not in STOP], result.cached_tokens


def insertion(model, count: int, extras: tuple[int, ...]) -> list[dict]:
    engine = Engine(EngineConfig(enable_cache=False), model=model)
    rng = random.Random(0)
    rows = []
    for k in extras:
        wrong = 0
        for i in range(count):
            (first, reply), (second, expected) = question(f"boundary/{i}/a"), question(f"boundary/{i}/b")
            noise = [STOP[0]][:k] + [rng.randrange(32, 127) for _ in range(k - 1)]
            ids = TOKENIZER.encode(f"{PREAMBLE}{first} {reply}") + noise + TOKENIZER.encode(f"\n{second}")
            wrong += first_number(TOKENIZER.decode(answer_of(engine, ids)[0])) != expected
        rows.append({"inserted_tokens": k, "wrong": wrong, "total": count})
    return rows


def alias(model, count: int, cut: int) -> list[dict]:
    cold = Engine(EngineConfig(enable_cache=False), model=model)
    rows = []
    for policy in ("copy", "transfer"):
        engine = Engine(EngineConfig(donate_policy=policy, overlap=True, page_size=1, num_pages=8192), model=model)
        hits = differ = wrong = 0
        for i in range(count):
            text, expected = question(f"boundary/alias/{i}")
            prompt = TOKENIZER.encode(PREAMBLE + text)
            head, _ = answer_of(engine, prompt, max_tokens=cut, stop=())
            tail, cached = answer_of(engine, prompt + head)
            hits += cached == len(prompt) + cut - 1  # restored the state donated at the cut's finish
            differ += tail != answer_of(cold, prompt + head)[0]
            wrong += first_number(TOKENIZER.decode(head + tail)) != expected
        rows.append({"policy": policy, "cut": cut, "finish_hits": hits, "differ_from_cold": differ, "wrong": wrong,
                     "total": count})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="probe-tiny")
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.model)
    inserted = insertion(model, args.count, (0, 1, 2, 4, 8))
    aliased = [row for cut in (2, 3) for row in alias(model, args.count, cut)]
    print(f"model {args.model}, greedy, {args.count} arithmetic follow-ups per row")
    print(f"{'inserted tokens':>15} {'wrong':>9}")
    for r in inserted:
        print(f"{r['inserted_tokens']:>15} {r['wrong']:>4}/{r['total']:<4}")
    print(f"{'policy':<9} {'cut':>3} {'finish hits':>11} {'differ from cold':>16} {'wrong':>9}")
    for r in aliased:
        print(f"{r['policy']:<9} {r['cut']:>3} {r['finish_hits']:>11} {r['differ_from_cold']:>16} "
              f"{r['wrong']:>4}/{r['total']:<4}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "count": args.count, "insertion": inserted, "alias": aliased}, f, indent=2)


if __name__ == "__main__":
    main()
