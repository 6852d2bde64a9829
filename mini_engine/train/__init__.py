"""Training a hybrid model on the probe grammar (``mini-engine train``): data, forward, loop, recipes.

The only part of ``mini_engine`` that reads the harness's ``probes`` package (its generators are
the training data); the engine itself never imports it.
"""

from mini_engine.train.recipe import RECIPES, Recipe, get_recipe, parse_mix

__all__ = ["RECIPES", "Recipe", "get_recipe", "parse_mix"]
