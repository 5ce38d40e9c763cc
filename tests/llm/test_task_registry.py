"""The task registry: lookup and registration rules, the three wiring bugs it fixes (each test
fails on the code before it), and a task added in one file trained and evaluated end to end."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from llm.config import config_from_dict
from llm.eval.diversity import diversity_scores, formula_set, formula_uniqueness
from llm.orchestrate.jobs import eval_key
from llm.rollout.base import RolloutBatch, response_mask_from_eos
from llm.rollout.hf import HFGenerateBackend
from llm.run.checkpoint import latest_checkpoint
from llm.tasks import (
    COUNTDOWN,
    TASKS,
    Task,
    UnknownTaskError,
    parse_expression,
    register_task,
    solution_key,
)
from llm.tasks.math.task import math_expressions
from llm.train.loop import user_code
from llm.train.trainer import train
from tests.llm import parity_task


def test_lookup_lists_the_known_tasks():
    assert {"countdown", "math", "parity"} <= set(TASKS)
    assert TASKS["countdown"] is COUNTDOWN
    with pytest.raises(KeyError, match=r"unknown task 'sudoku'; known: \[.*'countdown'.*'math'"):
        TASKS["sudoku"]
    with pytest.raises(ValueError, match="unknown task"):  # also a ValueError, for bad input
        TASKS["sudoku"]
    assert "sudoku" not in TASKS and TASKS.get("sudoku") is None
    assert issubclass(UnknownTaskError, KeyError)


def test_registration_refuses_duplicates_and_bad_records():
    with pytest.raises(ValueError, match="'countdown' is already registered"):
        register_task(COUNTDOWN)
    with pytest.raises(ValueError, match="templates"):
        Task("x", (), *(lambda *a, **k: None,) * 5)  # fmt: skip
    with pytest.raises(ValueError, match=r"expected a llm\.tasks\.Task"):
        register_task("countdown")  # type: ignore[arg-type]


def test_dsdr_formula_uniqueness_is_not_zero_on_math():
    # Bug before the registry: F_i was Countdown's `<answer>` equation, empty for every math
    # response, so DSDR's formula term was 0 on math (configs/math_qwen3_1p7b_dsdr.toml).
    assert formula_set("so \\boxed{42}", task="math") == {"42"}
    group = [
        "Since $x = 6 \\cdot 7$, \\boxed{42}",
        "Since $x = 40 + 2$, \\boxed{42}",
        "Since $x = 6 \\cdot 7$, \\boxed{42}",
        "no formula at all",
    ]
    u = formula_uniqueness([formula_set(t, task="math") for t in group])
    # Response 1 has one unique formula of two ("x = 40 + 2"); 0 and 2 share both; 3 has none.
    np.testing.assert_allclose(u, [0.0, 0.5, 0.0, 0.0])
    scores = diversity_scores([group], task="math")
    no_formula = diversity_scores([group], task="countdown")  # Countdown finds no equations
    assert scores[0, 1] == pytest.approx(no_formula[0, 1] + 0.25)


def test_countdown_formula_set_is_the_canonical_answer():
    expr = parse_expression("(3 + 5) * 2")
    key = solution_key(expr)
    assert formula_set("... <answer> 2 * (5 + 3) </answer>", task="countdown") == {key}
    assert formula_set("no answer", task=COUNTDOWN) == frozenset()


def test_math_expressions_scan():
    text = "Let $a$ and $$ b + c $$ then \\(d\\) and \\[e\\], cost \\$5, \\boxed{ 1 / 2 } $unclosed"
    assert math_expressions(text) == {"a", "b + c", "d", "e", "1 / 2"}
    assert math_expressions("$" * 100_001) == frozenset()  # linear, never raises


def _cfg(**over):
    raw = {"task": "parity", "template": "bits", "data": {"source": "generate"},
           "eval": {"source": "generate"}, **over}  # fmt: skip
    return config_from_dict(raw)


def test_config_checks_the_template_of_the_task():
    # Bug before the registry: any task other than Countdown was given the math templates, and
    # the config knew only the two built-in task names.
    assert _cfg().template == "bits"
    with pytest.raises(ValueError, match=r"template: expected one of \('bits',\) \(parity\)"):
        _cfg(template="qwen-math")
    with pytest.raises(ValueError, match=r"template: expected one of .*compact.*\(countdown\)"):
        config_from_dict({"task": "countdown", "template": "plain"})
    with pytest.raises(ValueError, match=r"data.source: expected generate or file \(task = parity"):
        _cfg(data={"source": "tiny"})
    with pytest.raises(ValueError, match="task: expected one of"):
        _cfg(task="sudoku")


class ParityPlantingBackend:
    """The real `HFGenerateBackend`, with the first response of every group replaced by the right
    answer, so a random model's groups are mixed and the reward goes through the parity verifier."""

    def __init__(self, model, tokenizer):
        self.inner, self.tok = HFGenerateBackend(model, tokenizer), tokenizer
        self.tokenizer = tokenizer

    def sync_weights(self, model):
        self.inner.sync_weights(model)

    def generate(self, prompts, group_size, **kw) -> RolloutBatch:
        roll = self.inner.generate(prompts, group_size, **kw)
        t = kw["sampling"].max_new_tokens
        ids = torch.nn.functional.pad(
            roll.response_ids, (0, t - roll.response_ids.shape[-1]), value=self.tok.pad_token_id
        )
        for b, prompt in enumerate(prompts):
            bits = [int(w) for w in prompt.split()[1:-1]]
            text = f"<answer> {sum(bits) % 2} </answer>"
            planted = [*self.tok(text, add_special_tokens=False).input_ids, self.tok.eos_token_id]
            ids[b, 0] = torch.tensor((planted + [self.tok.pad_token_id] * t)[:t])
        mask = response_mask_from_eos(ids, self.tok.eos_token_id)
        ids = ids.masked_fill(~mask, self.tok.pad_token_id)
        texts = self.tok.batch_decode(ids.reshape(-1, t), skip_special_tokens=True)
        roll.response_ids, roll.response_mask = ids, mask.float()
        roll.logp = torch.nn.functional.pad(roll.logp, (0, t - roll.logp.shape[-1]))
        roll.logp = roll.logp.masked_fill(~mask, 0.0)
        roll.texts = [texts[i * group_size : (i + 1) * group_size] for i in range(len(prompts))]
        return roll


def test_a_new_task_trains_and_evaluates_end_to_end(tiny_model_path, tmp_path, monkeypatch):
    import llm.eval.diversity
    from llm.__main__ import main

    # DSDR's semantic term on the lexical fallback: loading MiniLM would cost seconds.
    monkeypatch.setattr(llm.eval.diversity, "load_encoder", lambda device="cpu": None)
    assert TASKS["parity"].prompt(parity_task.ParityProblem((1, 0, 1)), "bits") == "nums 1 0 1 :"
    raw = {"model_path": tiny_model_path, "task": "parity", "template": "bits",
           "method": "dsdr", "steps": 2,
           "rollout": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4},
           "run": {"tensorboard": False, "save_every": 1},
           "data": {"source": "generate", "n_problems": 6},
           "eval": {"source": "generate", "n_problems": 2, "samples": 2}}  # fmt: skip
    cfg = config_from_dict(raw)
    out = tmp_path / "run"
    hist = train(
        cfg, out, backend_factory=lambda c, m, t: ParityPlantingBackend(m, t), progress=False
    )
    assert [h["step"] for h in hist] == [1, 2]
    assert all(h["charts/pass_rate"] == 1.0 for h in hist)  # the planted answer is right
    assert latest_checkpoint(out).name == "step_000002"

    data = tmp_path / "parity.jsonl"
    data.write_text('{"bits": [1, 1, 0]}\n{"bits": [1, 0, 0, 0]}\n')
    argv = ["--debug", "eval", "--model", str(out), "--config", str(out / "config.toml"),
            "--problems", str(data), "--n", "2", "--out", str(tmp_path / "ev"), "--label", "p",
            "--no-semantic", "--no-bleu"]  # fmt: skip
    assert main(argv) == 0
    res = json.loads((tmp_path / "ev" / "eval.json").read_text())["p"]
    assert [p["bits"] for p in res["per_problem"]] == [[1, 1, 0], [1, 0, 0, 0]]
    assert set(res["pass_at_k"]) == {"1", "2"} and 0 <= res["accuracy"] <= 1
    assert "solution_coverage" not in res  # parity counts no solutions


def test_a_users_task_is_keyed_by_its_code(tmp_path):
    """`Task.code`: None for the package's tasks; for a task whose functions come from a user's
    file the SHA-256 of that file (a copy with one function of the user's own: that file's alone),
    and it enters a run's `user_code` (reuse, checkpoints, resume) and the evaluation key (an
    edited grader evaluates again)."""
    assert TASKS["countdown"].code is None and TASKS["math"].code is None
    parity = Path(parity_task.__file__).read_bytes()
    assert TASKS["parity"].code == hashlib.sha256(parity).hexdigest()[:16]
    mine = tmp_path / "my_grader.py"
    mine.write_text("def score(text, problem, format_score=0.0):\n    return 0.0\n")
    namespace: dict = {}
    exec(compile(mine.read_text(), str(mine), "exec"), namespace)
    copy = register_task(
        dataclasses.replace(COUNTDOWN, name="graded_test", score=namespace["score"])
    )
    try:
        assert copy.code == hashlib.sha256(mine.read_bytes()).hexdigest()[:16]
        assert TASKS["graded_test"] is copy and COUNTDOWN.code is None
        cfg = config_from_dict({"model_path": str(tmp_path / "m"), "task": "graded_test"})
        assert user_code(cfg) == {"task_code": copy.code}
        key = eval_key({"samples": 4}, cfg, [], "heldout")
        assert key["task_code"] == copy.code
        assert "task_code" not in eval_key({"samples": 4}, dataclasses.replace(
            cfg, task="countdown"), [], "heldout")  # fmt: skip
    finally:
        TASKS._tasks.pop("graded_test")  # type: ignore[attr-defined]
