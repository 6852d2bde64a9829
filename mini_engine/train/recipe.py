"""Training recipes: the model shape, the data mix and the optimiser schedule, under one name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from mini_engine.model.builtin import builtin_config
from mini_engine.model.config import ModelConfig

__all__ = ["RECIPES", "Recipe", "get_recipe", "parse_mix"]


@dataclass(frozen=True)
class Recipe:
    name: str
    model: Callable[[], ModelConfig]
    model_name: str  # the name the trained checkpoint's config carries
    mix: dict[str, int] = field(default_factory=dict)  # examples of each family per step
    steps: int = 6000
    lr: float = 2e-3
    min_lr: float = 1e-4
    warmup: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    lm_weight: float = 0.05  # weight of next-token loss on context tokens (answers weigh 1)
    eval_every: int = 500
    eval_count: int = 32  # probes per family at each evaluation

    def describe(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "model"}


def _probe_tiny_config() -> ModelConfig:
    # The built-in tiny shape (8 layers, 3:1, hidden 128), so the trained model costs what the
    # random one costs and every engine test keeps its speed.
    from dataclasses import replace

    return replace(builtin_config("tiny-random"), name="probe-tiny")


RECIPES: dict[str, Recipe] = {
    "probe-tiny": Recipe(
        name="probe-tiny", model=_probe_tiny_config, model_name="probe-tiny",
        mix={"arithmetic": 16, "needle": 8, "recall": 8, "media": 8},
    ),
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def parse_mix(text: str) -> dict[str, int]:
    """``"arithmetic=32,media=16"`` -> ``{"arithmetic": 32, "media": 16}``; ValueError naming the bad part."""
    from mini_engine.train.data import FAMILY_MAKERS

    mix = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        family, _, count = part.partition("=")
        if family not in FAMILY_MAKERS or not count.isdigit() or int(count) < 1:
            raise ValueError(f"{part!r}: write FAMILY=N with N >= 1 and FAMILY one of {sorted(FAMILY_MAKERS)}")
        mix[family] = int(count)
    if not mix:
        raise ValueError("the mix names no family")
    return mix
