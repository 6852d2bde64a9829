"""mini_engine.train: the probe-grammar data, the differentiable forward, and a CPU smoke run."""

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from mini_engine.cli import main
from mini_engine.model import ByteTokenizer, build_builtin, load_pretrained
from mini_engine.train import get_recipe
from mini_engine.train.data import IGNORE, Segment, build_example, collate, draw_examples
from mini_engine.train.evaluate import ask_engine, ask_recompute, eval_probes
from mini_engine.ops import invariant as inv
from mini_engine.train.forward import dense_logits, sequence_logits
from mini_engine.train.loop import train

TOKENIZER = ByteTokenizer()
EOT, IM_END = TOKENIZER.eos_token_ids
SMALL_MIX = {"arithmetic": 2, "media": 1}


def test_answer_labels_name_the_answer_and_the_token_that_ends_the_reply():
    example = build_example("arithmetic", [Segment("Compute 1+2. Answer:"), Segment(" 3", answer=True, end=EOT),
                                           Segment("\nCompute 2+2. Answer:"), Segment(" 4", answer=True, end=EOT)])
    assert len(example.ids) == len(example.answer_labels)
    labelled = [(TOKENIZER.decode(example.ids[: i + 1])[-1], label) for i, label in enumerate(example.answer_labels)
                if label != IGNORE]
    # After "Answer:" comes " ", after " " the digit, after the digit the end of the reply, even though the
    # input goes on with a new line (a follow-up turn drops the end token from the context).
    assert labelled == [(":", ord(" ")), (" ", ord("3")), ("3", EOT), (":", ord(" ")), (" ", ord("4")), ("4", EOT)]


def test_chat_answers_end_with_im_end_and_media_rows_point_at_media_tokens():
    examples = draw_examples({"media": 6}, seed=3, step=0)
    for example in examples:
        (position, item), = example.media
        assert example.ids[position] == TOKENIZER.media_token_id and item.startswith(b"color:")
        answer = [label for label in example.answer_labels if label != IGNORE]
        assert answer[-1] in (EOT, IM_END)
        word = TOKENIZER.decode(answer[:-1]).strip()
        assert word.encode() in item  # the answer is one of the item's own attribute values


def test_steps_are_pure_functions_of_seed_and_step_and_differ_between_steps():
    assert draw_examples(SMALL_MIX, 0, 5) == draw_examples(SMALL_MIX, 0, 5)
    assert draw_examples(SMALL_MIX, 0, 5) != draw_examples(SMALL_MIX, 0, 6)
    assert draw_examples(SMALL_MIX, 0, 5) != draw_examples(SMALL_MIX, 1, 5)
    with pytest.raises(ValueError, match="unknown families.*'poetry'"):
        draw_examples({"poetry": 1}, 0, 0)


def test_the_training_forward_is_the_inference_forward_from_position_zero(tiny_model):
    tokens = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in (70, 5, 130)]
    with torch.no_grad():
        cold = tiny_model(tokens, [tiny_model.new_state() for _ in tokens], all_logits=True)
        assert torch.equal(sequence_logits(tiny_model, tokens), torch.cat([o.logits for o in cold]))


def test_the_dense_forward_computes_what_the_packed_reference_computes(tiny_model):
    """Right padding changes no real position; every op of the dense form matches its reference."""
    examples = draw_examples({"arithmetic": 2, "media": 1, "needle": 1}, 0, 0)
    tokens, media, _, _ = collate(examples)
    lengths = [len(e.ids) for e in examples]
    assert len(set(lengths)) > 1  # the padding is exercised
    with torch.no_grad():
        packed = sequence_logits(tiny_model, [tokens[i, :n] for i, n in enumerate(lengths)], media)
        with inv.relaxed():
            dense = dense_logits(tiny_model, tokens, media)
    dense = torch.cat([dense[i, :n] for i, n in enumerate(lengths)])
    assert ((dense - packed).norm() / packed.norm()).item() < 1e-5


def test_gradients_reach_every_parameter():
    model = build_builtin("tiny-random").train()
    tokens, media, answer, following = collate(draw_examples({"media": 1, "arithmetic": 1}, 0, 0))
    logits = dense_logits(model, tokens, media)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), following.flatten(), ignore_index=IGNORE).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert missing == []


def _batch_loss(model, examples) -> float:
    tokens, media, answer, _ = collate(examples)
    with torch.no_grad(), inv.relaxed():
        logits = dense_logits(model, tokens, media)
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), answer.flatten(), ignore_index=IGNORE))


def test_a_few_cpu_steps_lower_the_loss_and_the_checkpoint_round_trips(tmp_path):
    recipe = replace(get_recipe("probe-tiny"), mix=SMALL_MIX, warmup=2, eval_every=10**9)
    held_out = draw_examples(SMALL_MIX, seed=99, step=0)
    from mini_engine.model.builtin import init_weights
    from mini_engine.model.hybrid import HybridModel

    before = _batch_loss(init_weights(HybridModel(recipe.model()), seed=1), held_out)  # train()'s init for seed 0
    result = train(recipe, tmp_path / "ckpt", seed=0, steps=10, final_eval=1, echo=lambda _: None)
    model = load_pretrained(tmp_path / "ckpt")
    after = _batch_loss(model, held_out)
    assert after < before - 1.0, (before, after)
    record = json.loads((tmp_path / "ckpt" / "training.json").read_text())
    assert record["recipe"]["name"] == "probe-tiny" and record["seed"] == 0 and record["steps"] == result.steps == 10
    assert record["device"].startswith("cpu") and record["wall_s"] > 0
    assert set(record["validation_accuracy"]) == set(SMALL_MIX)
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "answer_loss" in r] == [1, 10]


def test_the_two_ways_of_asking_agree(tiny_model):
    probes = eval_probes("arithmetic", 5, 2) + eval_probes("media", 5, 2)
    assert ask_recompute(tiny_model, probes) == ask_engine(tiny_model, probes)


def test_cli_trains_and_names_a_bad_recipe(tmp_path):
    runner = CliRunner()
    bad = runner.invoke(main, ["train", "--recipe", "nope", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--recipe" in bad.output and "probe-tiny" in bad.output
    bad = runner.invoke(main, ["train", "--device", "nonsense", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--device" in bad.output


def test_a_second_stage_continues_the_first_ones_weights_and_data(tmp_path):
    recipe = replace(get_recipe("probe-tiny"), mix={"media": 1}, warmup=1, eval_every=10**9)
    train(recipe, tmp_path / "one", steps=2, final_eval=0, echo=lambda _: None)
    train(recipe, tmp_path / "two", steps=1, final_eval=0, init=tmp_path / "one", echo=lambda _: None)
    record = json.loads((tmp_path / "two" / "training.json").read_text())
    assert [stage["steps"] for stage in record["earlier_stages"]] == [2] and record["steps"] == 1
    runner = CliRunner()
    bad = runner.invoke(main, ["train", "--init", str(tmp_path), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--init" in bad.output and "training.json" in bad.output
