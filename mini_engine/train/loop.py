"""The training loop: AdamW on the probe mix, per-family accuracy as it goes, a checkpoint at the end.

The output folder is a Hugging Face-style checkpoint (``config.json`` + ``model.safetensors``, read
by ``mini_engine.model.load_pretrained``) plus ``training.json`` (recipe, seed, steps, wall time,
device, final losses and accuracies) and ``train_log.jsonl`` (one row per logged step or
evaluation). Every step's data is a pure function of (seed, step), so a run is reproducible up to
the device's floating-point order.
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from mini_engine.model.builtin import init_weights
from mini_engine.model.hybrid import HybridModel
from mini_engine.model.loader import load_pretrained, save_pretrained
from mini_engine.train.data import IGNORE, collate, draw_examples
from mini_engine.train.evaluate import ask_recompute, eval_probes, score
from mini_engine.train.forward import dense_logits
from mini_engine.train.recipe import Recipe

__all__ = ["TrainResult", "earlier_stages", "train"]

VALIDATION_SEED = 7_000_003  # probe seed of the evaluations during training (not the families' test seeds)
LOG_EVERY = 25


@dataclass(frozen=True)
class TrainResult:
    folder: Path
    steps: int
    wall_s: float
    first_loss: float
    last_loss: float
    accuracy: dict[str, float]


def _lr(recipe: Recipe, step: int, progress: float) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    return recipe.min_lr + 0.5 * (recipe.lr - recipe.min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))


def _optimizer(model: HybridModel, recipe: Recipe) -> torch.optim.Optimizer:
    decay, plain = [], []
    for name, param in model.named_parameters():
        (decay if param.dim() == 2 and "embed_tokens" not in name else plain).append(param)
    return torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                              {"params": plain, "weight_decay": 0.0}], lr=recipe.lr, betas=(0.9, 0.98))


def evaluate(model: HybridModel, recipe: Recipe, count: int, device, seed: int = VALIDATION_SEED) -> dict:
    """Per-family scores of ``count`` validation probes per family (recompute greedy)."""
    scores = {}
    for family in recipe.mix:
        probes = eval_probes(family, seed, count)
        scores[family] = score(family, probes, ask_recompute(model, probes, device=device)).as_dict()
    return scores


def train(recipe: Recipe, out: str | Path, *, seed: int = 0, steps: int | None = None, device: str = "cpu",
          time_limit: float | None = None, final_eval: int = 64, init: str | Path | None = None,
          echo: Callable[[str], None] = print) -> TrainResult:
    """Train ``recipe`` for ``steps`` (or until ``time_limit`` seconds) and save the checkpoint in ``out``.

    ``init``: start from that checkpoint's weights instead of the seeded initialisation (a second
    stage: its data continue after the steps recorded in its ``training.json``)."""
    steps = recipe.steps if steps is None else steps
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    earlier = earlier_stages(init)
    first_step = sum(stage["steps"] for stage in earlier)
    model = (init_weights(HybridModel(recipe.model()), seed=seed + 1) if init is None
             else load_pretrained(init)).to(device).train()
    optimizer = _optimizer(model, recipe)
    log = (folder / "train_log.jsonl").open("w")
    started = time.perf_counter()
    first_loss = last_loss = float("nan")
    step = 0
    try:
        while step < steps:
            elapsed = time.perf_counter() - started
            if time_limit is not None and elapsed >= time_limit:
                break
            progress = max(step / steps, elapsed / time_limit if time_limit else 0.0)
            for group in optimizer.param_groups:
                group["lr"] = _lr(recipe, step, progress)
            tokens, media, answer, following = collate(draw_examples(recipe.mix, seed, first_step + step), device)
            logits = F.log_softmax(dense_logits(model, tokens, media), -1).flatten(0, 1)
            answer, following = answer.flatten(), following.flatten()
            answer_loss = F.nll_loss(logits, answer, ignore_index=IGNORE)
            lm_loss = F.nll_loss(logits, torch.where(answer == IGNORE, following, IGNORE), ignore_index=IGNORE)
            loss = answer_loss + recipe.lm_weight * lm_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
            optimizer.step()
            step += 1
            if step == 1 or step % LOG_EVERY == 0 or step == steps:
                last_loss = float(answer_loss.detach())
                first_loss = last_loss if step == 1 else first_loss
                row = {"step": step, "answer_loss": last_loss, "lm_loss": float(lm_loss.detach()), "grad_norm": float(norm),
                       "lr": optimizer.param_groups[0]["lr"], "elapsed_s": round(time.perf_counter() - started, 2),
                       "tokens": int((following != IGNORE).sum()) + len(tokens)}
                log.write(json.dumps(row) + "\n")
                log.flush()
                echo(f"step {step:6d}  answer loss {last_loss:.4f}  lm loss {row['lm_loss']:.3f}  "
                     f"lr {row['lr']:.2e}  {row['elapsed_s']:.0f} s")
            if step % recipe.eval_every == 0:
                scores = evaluate(model, recipe, recipe.eval_count, device)
                log.write(json.dumps({"step": step, "eval": scores}) + "\n")
                log.flush()
                echo("  eval " + "  ".join(f"{f} {s['accuracy']:.0%}" for f, s in scores.items()))
        wall = time.perf_counter() - started
        final = evaluate(model, recipe, final_eval, device) if final_eval else {}
        log.write(json.dumps({"step": step, "final_eval": final}) + "\n")
    finally:
        log.close()
    save_pretrained(model.cpu().eval(), folder)
    record = {"recipe": recipe.describe(), "seed": seed, "steps": step, "steps_asked": steps,
              "earlier_stages": earlier,
              "time_limit_s": time_limit, "wall_s": round(wall, 1), "device": _device_name(device),
              "torch": torch.__version__, "python": platform.python_version(),
              "first_answer_loss": first_loss, "last_answer_loss": last_loss,
              "validation_accuracy": {f: s["accuracy"] for f, s in final.items()},
              "validation_probes_per_family": final_eval, "validation_seed": VALIDATION_SEED}
    (folder / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return TrainResult(folder, step, wall, first_loss, last_loss, record["validation_accuracy"])


def earlier_stages(init: str | Path | None) -> list[dict]:
    """The training records of the checkpoint ``init`` and of the stages before it (oldest first)."""
    if init is None:
        return []
    path = Path(init) / "training.json"
    if not path.is_file():
        raise ValueError(f"{init}: no training.json, so the data of its steps cannot be continued")
    record = json.loads(path.read_text())
    stage = {k: record[k] for k in ("seed", "steps", "wall_s", "device", "validation_accuracy")}
    return [*record.get("earlier_stages", []), stage]


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
