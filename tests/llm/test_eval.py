"""Evaluation: pass@k (unbiased, monotone in k), distinct solutions, Distinct-n, Self-BLEU, and
the `python -m llm eval` command writing eval.json and the pass@k plot."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from llm.__main__ import main
from llm.eval import distinct_n, evaluate, k_values, self_bleu, write_eval
from llm.tasks import generate_problems, write_problems_jsonl
from llm.trainer import load_tokenizer
from tests.llm.test_trainer import MAX_NUMBER, PlantingBackend

KEYS = {
    "n", "n_problems", "pass_at_k", "accuracy", "format_rate", "distinct_correct",
    "solution_coverage", "distinct_n", "self_bleu", "semantic_cosine_correct", "per_problem",
}  # fmt: skip


def _problems(n=3):
    return generate_problems(n, seed=5, num_numbers=3, max_number=9, max_target=MAX_NUMBER)


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(16) == [1, 2, 4, 8, 16]
    assert k_values(6) == [1, 2, 4, 6]


def test_distinct_n_and_self_bleu():
    assert distinct_n(["a b c", "a b d"], 1) == pytest.approx(4 / 6)
    assert distinct_n(["a b c", "a b d"], 2) == pytest.approx(3 / 4)
    assert distinct_n([""], 2) == 0.0
    assert self_bleu(["a b c d", "a b c d"]) == pytest.approx(1.0)
    assert self_bleu(["a b c d", "e f g h"]) < 0.1
    assert self_bleu(["only one"]) is None


def test_evaluate_keys_and_monotone_pass_at_k(tiny_model_path, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    backend = PlantingBackend(model, load_tokenizer(tiny_model_path))
    res = evaluate(backend, _problems(), n=4, max_new_tokens=12, prompts_per_batch=2)
    assert KEYS <= res.keys()
    values = [res["pass_at_k"][str(k)] for k in (1, 2, 4)]
    assert values == sorted(values)
    assert values[-1] == 1.0  # the planted solution makes every problem solved at k = n
    assert res["distinct_correct"] >= 1.0
    assert 0 < res["solution_coverage"] <= 1
    assert set(res["distinct_n"]) == {"1", "2", "3", "4"}
    path = write_eval(tmp_path, "planted", res, model="x")
    write_eval(tmp_path, "again", res)
    data = json.loads(path.read_text())
    assert set(data) == {"planted", "again"} and data["planted"]["model"] == "x"
    assert (tmp_path / "passk.png").stat().st_size > 0


def test_eval_command_writes_eval_json(tiny_model_path, tmp_path):
    problems = tmp_path / "p.jsonl"
    write_problems_jsonl(_problems(2), problems)
    argv = ["eval", "--model", tiny_model_path, "--problems", str(problems), "--n", "4",
            "--out", str(tmp_path / "ev"), "--label", "base", "--max-new-tokens", "6",
            "--no-semantic"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert KEYS <= data["base"].keys()
    assert list(data["base"]["pass_at_k"]) == ["1", "2", "4"]
    assert (tmp_path / "ev" / "passk.png").is_file()
