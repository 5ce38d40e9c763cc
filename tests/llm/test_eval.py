"""Evaluation: pass@k (unbiased, monotone in k), distinct solutions, Distinct-n, Self-BLEU, and
the `python -m llm eval` command writing eval.json and the pass@k plot."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from llm.__main__ import main
from llm.eval.heldout import (
    distinct_n,
    evaluate,
    k_values,
    self_bleu,
    self_bleu_reference,
)
from llm.eval.written import write_eval
from llm.model.load import load_tokenizer
from llm.rollout.base import Sampling
from llm.tasks import generate_problems, write_problems_jsonl
from tests.llm.test_trainer import MAX_NUMBER, PlantingBackend

KEYS = {
    "n", "n_problems", "pass_at_k", "accuracy", "format_rate", "distinct_correct",
    "solution_coverage", "distinct_n", "self_bleu", "semantic_cosine_correct", "per_problem",
}  # fmt: skip
MATH_KEYS = {
    "n", "n_problems", "pass_at_k", "accuracy", "boxed_rate", "distinct_answers", "distinct_n",
    "self_bleu", "semantic_cosine_correct", "per_problem",
}  # fmt: skip
"""The keys of eval.json before the task registry; they stay (new keys are only added)."""


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


_RESPONSES = ["<answer> 3 + 4 * 5 </answer>", "<answer> 4 * 5 + 3 </answer>", "<answer> 23 </answer>",
              "<answer> ( 3 + 4 ) * 5 </answer>", "3 + 4", "", "<answer> 5 * 4 + 3 </answer> 7"]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(_RESPONSES), min_size=2, max_size=16))
def test_self_bleu_shares_equal_texts_and_equals_the_plain_loop_to_the_bit(texts):
    """Sharpened groups repeat texts: one sentence BLEU per distinct text gives the same bits."""
    assert self_bleu(texts) == self_bleu_reference(texts)
    assert self_bleu(tuple(texts)) == self_bleu_reference(texts)


def test_evaluate_keys_and_monotone_pass_at_k(tiny_model_path, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    backend = PlantingBackend(model, load_tokenizer(tiny_model_path))
    res = evaluate(
        backend, "countdown", _problems(), template="compact", samples=4, max_new_tokens=12,
        prompts_per_batch=2,
    )  # fmt: skip
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


class ScriptedMathBackend:
    """Responses per prompt: the gold answer boxed in the first `correct` of n, a wrong box next,
    then no box, so every pass@k and rate has a closed form."""

    def __init__(self, answers: dict[str, str], correct: int) -> None:
        self.answers, self.correct = answers, correct

    def generate(self, prompts, n, *, sampling, **_):
        from types import SimpleNamespace

        self.sampling = sampling
        texts = []
        for p in prompts:
            gold = self.answers[p]
            group = [f"so \\boxed{{{gold}}}" if i < self.correct else "no box" for i in range(n)]
            if self.correct < n:
                group[self.correct] = "\\boxed{-12345}"
            texts.append(group)
        return SimpleNamespace(texts=texts)


def test_evaluate_math_closed_form():
    from llm.tasks.math.task import generate_math_problems, make_math_prompt

    problems = generate_math_problems(3, seed=0)
    answers = {make_math_prompt(p, "plain"): p.answer for p in problems}
    backend = ScriptedMathBackend(answers, correct=2)
    res = evaluate(backend, "math", problems, samples=4, template="plain")
    assert not backend.sampling.want_logprobs  # texts only
    assert MATH_KEYS <= res.keys()
    # c = 2 of n = 4: pass@1 = 1/2, pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass@4 = 1.
    assert res["pass_at_k"] == pytest.approx({"1": 0.5, "2": 5 / 6, "4": 1.0})
    assert res["boxed_rate"] == res["format_rate"] == pytest.approx(0.75)
    assert res["distinct_answers"] == pytest.approx(2.0)
    assert res["distinct_correct"] == pytest.approx(1.0)  # both correct responses box the gold
    assert [p["correct"] for p in res["per_problem"]] == [2, 2, 2]
    assert [p["id"] for p in res["per_problem"]] == [p.id for p in problems]


def test_evaluate_refuses_a_template_of_another_task():
    from llm.tasks.math.task import generate_math_problems

    with pytest.raises(ValueError, match=r"template: expected one of .*'math'.*'compact'"):
        evaluate(ScriptedMathBackend({}, 1), "math", generate_math_problems(1, seed=0),
                 template="compact", samples=2)  # fmt: skip


def test_eval_generate_builds_the_config_task_problems(tiny_model_path, tmp_path):
    # Bug on main before the task registry: `eval --generate` always built Countdown problems.
    cfg = tmp_path / "math.toml"
    cfg.write_text(
        f'model_path = "{tiny_model_path}"\ntask = "math"\ntemplate = "plain"\n'
        '[rollout]\nmax_new_tokens = 3\n[data]\nsource = "generate"\n[eval]\nsource = "generate"\n'
    )
    out = tmp_path / "eval"
    argv = ["--debug", "eval", "--model", tiny_model_path, "--config", str(cfg), "--generate", "2",
            "--n", "2", "--out", str(out), "--label", "m", "--no-semantic", "--no-bleu"]  # fmt: skip
    assert main(argv) == 0
    res = json.loads((out / "eval.json").read_text())["m"]
    assert MATH_KEYS <= res.keys()
    assert [p["id"] for p in res["per_problem"]] == ["arith-0", "arith-1"]


def test_eval_command_reads_the_config_eval_sets(tiny_model_path, tmp_path):
    from llm.tasks.math.loaders import write_math_jsonl
    from llm.tasks.math.task import generate_math_problems

    for name in ("aime", "amc"):
        write_math_jsonl(generate_math_problems(2, seed=len(name)), tmp_path / f"{name}.jsonl")
    cfg = tmp_path / "math.toml"
    cfg.write_text(
        f'model_path = "{tiny_model_path}"\ntask = "math"\ntemplate = "plain"\n'
        '[rollout]\nmax_new_tokens = 3\n[data]\nsource = "generate"\n'
        f'[eval]\nsource = "file"\npaths = ["{tmp_path / "aime.jsonl"}", "{tmp_path / "amc.jsonl"}"]\n'
        "samples = 2\n"
    )
    out = tmp_path / "eval"
    argv = ["eval", "--model", tiny_model_path, "--config", str(cfg), "--out", str(out),
            "--label", "tiny", "--no-semantic", "--no-bleu"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((out / "eval.json").read_text())
    assert sorted(data) == ["tiny/aime", "tiny/amc"]
    assert data["tiny/aime"]["n_problems"] == 2 and set(data["tiny/aime"]["pass_at_k"]) == {
        "1",
        "2",
    }


class RecordingBackend:
    """Texts "r<b>-<i>" for prompt b's i-th response; records each call's (prompts, group size,
    want_logprobs)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []
        self.index: dict[str, int] = {}

    def generate(self, prompts, group_size, *, sampling, **_):
        from types import SimpleNamespace

        self.calls.append((len(prompts), group_size, sampling.want_logprobs))
        texts = []
        for p in prompts:
            start = self.index.get(p, 0)
            self.index[p] = start + group_size
            texts.append([f"{p}-{start + i}" for i in range(group_size)])
        return SimpleNamespace(texts=texts)


@pytest.mark.parametrize(
    ("n", "cap", "per_batch", "calls"),
    [
        (3, 7, 8, [(2, 3)] * 2 + [(1, 3)]),  # 2 prompts x 3 = 6 <= 7 responses per call
        (3, 4096, 8, [(5, 3)]),  # the prompts-per-batch bound
        (3, 4096, 2, [(2, 3), (2, 3), (1, 3)]),
        (10, 4, 8, [(1, 4), (1, 4), (1, 2)] * 5),  # a group larger than the cap: split
    ],
)
def test_sample_texts_in_bounded_chunks_texts_only(n, cap, per_batch, calls):
    from llm.eval.heldout import _sample_texts

    prompts = [f"p{b}" for b in range(5)]
    backend = RecordingBackend()
    sampling = Sampling(4, want_logprobs=False)

    def draw(chunk, group):
        return [backend.generate(chunk, group, sampling=sampling)]

    (texts,) = _sample_texts(
        draw, prompts, samples=n, prompts_per_batch=per_batch, max_responses_per_call=cap
    )
    assert texts == [[f"{p}-{i}" for i in range(n)] for p in prompts]
    assert [c[:2] for c in backend.calls] == calls
    assert all(size * group <= max(cap, group) for size, group, _ in backend.calls)
    with pytest.raises(ValueError, match="max_responses_per_call"):
        _sample_texts(
            draw, prompts, samples=n, prompts_per_batch=per_batch, max_responses_per_call=0
        )
