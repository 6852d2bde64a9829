"""Plain greedy generation straight on the model: no cache manager, one sequence, for a first look."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from mini_engine.model import ByteTokenizer, HybridModel

__all__ = ["GenerationResult", "greedy_generate", "stream_greedy"]


@dataclass(frozen=True)
class GenerationResult:
    prompt_tokens: int
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (an end token) or "length" (max_tokens reached)


def stream_greedy(model: HybridModel, prompt_ids: list[int], max_tokens: int,
                  stop_ids: tuple[int, ...] = ()) -> Iterator[int]:
    """Yield greedy tokens one by one; stops after a stop token (yielded) or ``max_tokens``."""
    if not prompt_ids:
        raise ValueError("prompt must hold at least one token")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1; got {max_tokens}")
    state, new = model.new_state(), torch.tensor(prompt_ids)
    for _ in range(max_tokens):
        step = model([new], [state])[0]
        state, token = step.state, int(step.logits[-1].argmax())
        yield token
        if token in stop_ids:
            return
        new = torch.tensor([token])


def greedy_generate(model: HybridModel, tokenizer: ByteTokenizer, prompt: str, max_tokens: int = 32,
                    *, chat: bool = False) -> GenerationResult:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    prompt_ids = tokenizer.encode(text)
    tokens = list(stream_greedy(model, prompt_ids, max_tokens, tokenizer.eos_token_ids))
    finish = "stop" if tokens and tokens[-1] in tokenizer.eos_token_ids else "length"
    return GenerationResult(len(prompt_ids), tokens, tokenizer.decode(tokens, skip_special=True), finish)
