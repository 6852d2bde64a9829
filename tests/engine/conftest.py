"""Engine fixtures: a cold, alone, cache-off reference computed straight on the model."""

import pytest

from mini_engine.generate import stream_greedy


@pytest.fixture(scope="session")
def reference(tiny_model):
    """reference(prompt, max_tokens) -> greedy tokens of the prompt run cold and alone (memoised)."""
    memo = {}

    def run(prompt, max_tokens, stop_ids=()):
        key = (tuple(prompt), max_tokens, tuple(stop_ids))
        if key not in memo:
            memo[key] = list(stream_greedy(tiny_model, list(prompt), max_tokens, tuple(stop_ids)))
        return memo[key]

    return run
