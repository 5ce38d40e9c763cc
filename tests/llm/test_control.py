"""Driver-level controls of issue 39 (`llm.train.control`): DAPO dynamic sampling and overlong
masking, the adaptive entropy coefficient, outcome-based exploration bonuses; their pure
functions on hand-made inputs, and short runs through the real loop (metrics, determinism,
exact resume)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from llm.rollout.base import RolloutBatch
from llm.train import control
from llm.train.trainer import _step_seed, train
from tests.llm.test_trainer import PlantingBackend, _config

# ---------------------------------------------------------------------------------------------
# Adaptive entropy coefficient


def test_entropy_coefficient_moves_toward_the_target():
    kw = {"target": 0.2, "delta": 0.005, "lo": 0.0, "hi": 1.0}
    assert control.next_entropy_coef(0.01, 0.1, **kw) == pytest.approx(0.015)  # below: raise
    assert control.next_entropy_coef(0.01, 0.3, **kw) == pytest.approx(0.005)  # above: lower
    assert control.next_entropy_coef(0.01, 0.2, **kw) == pytest.approx(0.015)  # equal: raise (TRL)
    assert control.next_entropy_coef(0.002, 0.3, **kw) == 0.0  # clamped at >= 0
    assert control.next_entropy_coef(0.999, 0.0, **kw) == 1.0  # and at the maximum
    # The loss applies the coefficient only while the entropy is at or below the target.
    assert control.applied_entropy_coef(0.3, 0.1, target=0.2) == 0.3
    assert control.applied_entropy_coef(0.3, 0.25, target=0.2) == 0.0
    with pytest.raises(ValueError, match="delta"):
        control.next_entropy_coef(0.0, 0.0, target=0.2, delta=-1.0)


def test_entropy_controller_settles_around_the_target():
    # A policy whose entropy grows with the coefficient: e(c) = 0.05 + 2 c; the target 0.2 is
    # held at c* = 0.075. From c = 0 the controller climbs to c* and then stays within delta.
    c, trace = 0.0, []
    for _ in range(60):
        e = 0.05 + 2 * c
        c = control.next_entropy_coef(c, e, target=0.2, delta=0.005)
        trace.append(c)
    assert all(b > a for a, b in itertools.pairwise(trace[:15]))  # climbs first
    assert all(abs(x - 0.075) <= 0.005 + 1e-12 for x in trace[20:])


# ---------------------------------------------------------------------------------------------
# DAPO dynamic sampling


def test_mixed_groups():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.1, 0.0, 0.0]])
    assert control.mixed_groups(r).tolist() == [False, False, True, True]


@pytest.mark.parametrize("seed", range(40))
def test_dynamic_batch_holds_no_uniform_group_unless_the_budget_ran_out(seed):
    # The trainer's loop over rounds, on random mixed/uniform flags: B groups always; no uniform
    # group unless the budget ran out; the budget runs out only when fewer than B were mixed.
    rng = np.random.default_rng(seed)
    b, extra_rounds = int(rng.integers(1, 6)), int(rng.integers(0, 4))
    p_mixed = float(rng.uniform(0, 1))
    mixed: list[bool] = []
    for r in range(1 + extra_rounds):
        mixed += (rng.uniform(size=b) < p_mixed).tolist()
        chosen = control.select_groups(mixed, b, exhausted=r == extra_rounds)
        if chosen is not None:
            break
    assert chosen is not None
    picked, ran_out = chosen
    assert len(picked) == b and picked == sorted(set(picked))
    uniform = [i for i in picked if not mixed[i]]
    assert ran_out == (sum(mixed) < b)
    assert not uniform or ran_out
    if ran_out:  # every mixed group drawn is kept, the first uniform ones fill the rest
        assert [i for i in picked if mixed[i]] == [i for i, m in enumerate(mixed) if m]
        assert uniform == [i for i, m in enumerate(mixed) if not m][: len(uniform)]
    else:  # the first B mixed groups in draw order
        assert picked == [i for i, m in enumerate(mixed) if m][:b]


def test_resampling_rounds_have_their_own_seeds():
    assert _step_seed(0, 3) == _step_seed(0, 3, 0, 0)  # round 0 keeps the plain step seed
    seeds = {_step_seed(0, 3, 0, r) for r in range(5)} | {_step_seed(0, 3, 1)}
    assert len(seeds) == 6


def test_truncated_responses():
    eos, pad = 2, 0
    ids = torch.tensor([[[5, 6, 7], [5, 6, eos], [5, eos, pad], [5, 6, 7]]])  # (1, 4, 3)
    mask = torch.tensor([[[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]]], dtype=torch.float32)
    cut = control.truncated_responses(ids, mask, [eos], max_new_tokens=3)
    assert cut.tolist() == [[True, False, False, True]]
    # T below the budget: nothing was truncated.
    assert not control.truncated_responses(ids, mask, [eos], max_new_tokens=4).any()


def _roll(p: int, t: int, b: int, g: int, fill: float) -> RolloutBatch:
    return RolloutBatch(
        prompts=[f"p{fill}-{i}" for i in range(b)],
        prompt_ids=torch.full((b, p), int(fill), dtype=torch.long),
        prompt_mask=torch.ones(b, p),
        response_ids=torch.full((b, g, t), int(fill), dtype=torch.long),
        response_mask=torch.ones(b, g, t),
        logp=torch.full((b, g, t), -fill),
        texts=[[f"{fill}"] * g for _ in range(b)],
        entropy=torch.full((b, g, t), fill),
    )


def test_concat_rollouts_pads_prompts_left_and_responses_right():
    a, c = _roll(2, 3, 2, 2, 5.0), _roll(4, 1, 3, 2, 7.0)
    out = control.concat_rollouts([(a, [1]), (c, [0, 2])], pad_id=9)
    assert out.prompt_ids.shape == (3, 4) and out.response_ids.shape == (3, 2, 3)
    assert out.prompt_ids[0].tolist() == [9, 9, 5, 5]
    assert out.prompt_mask[0].tolist() == [0, 0, 1, 1]
    assert out.response_ids[1, 0].tolist() == [7, 9, 9]
    assert out.response_mask[1, 0].tolist() == [1, 0, 0]
    assert out.logp[1, 0].tolist() == [-7.0, 0.0, 0.0]
    assert out.entropy[2, 1].tolist() == [7.0, 0.0, 0.0]
    assert out.cand_ids is None
    assert out.prompts == ["p5.0-1", "p7.0-0", "p7.0-2"]
    with pytest.raises(ValueError, match="no group"):
        control.concat_rollouts([(a, [])], pad_id=9)


# ---------------------------------------------------------------------------------------------
# Outcome-based exploration


def _close(x: torch.Tensor, want: list[list[float]]) -> None:
    np.testing.assert_allclose(x.numpy(), np.asarray(want, dtype=np.float32), rtol=1e-6)


def test_ucb_bonus_and_counts_on_hand_made_answers():
    counts: control.AnswerCounts = {}
    prompts = ["x", "y"]
    answers = [["3", "3", "4", None], ["5", "5", "5", "5"]]
    first = control.ucb_bonus(counts, prompts, answers, 0.2)
    _close(first, [[0.2, 0.2, 0.2, 0.0], [0.2] * 4])  # N = 0 everywhere
    control.update_counts(counts, prompts, answers)
    assert counts == {"x": {"3": 2, "4": 1}, "y": {"5": 4}}
    second = control.ucb_bonus(counts, prompts, [["3", "4", "6", None], ["5", "7", "5", "5"]], 0.2)
    want = [
        [0.2 / math.sqrt(3), 0.2 / math.sqrt(2), 0.2, 0.0],
        [0.2 / math.sqrt(5), 0.2, 0.2 / math.sqrt(5), 0.2 / math.sqrt(5)],
    ]
    _close(second, want)


def test_batch_bonus_penalises_repeated_answers_within_a_group():
    pen = control.batch_bonus(
        [["a", "a", "b", None], ["c", "c", "c", "c"], ["a", "b", "c", "d"]], 0.3
    )
    _close(pen, [[-0.1, -0.1, 0.0, 0.0], [-0.3] * 4, [0.0] * 4])  # c (n - 1) / (G - 1)
    with pytest.raises(ValueError, match=">= 2"):
        control.batch_bonus([["a"]], 0.3)


# ---------------------------------------------------------------------------------------------
# Through the real loop


class HalfPlantingBackend(PlantingBackend):
    """Plants a solution only in the groups of problems with an even target, so the others stay
    all-wrong (uniform) for a random model."""

    def generate(self, prompts, group_size, **kw) -> RolloutBatch:
        roll = super().generate(prompts, group_size, **kw)
        keep = [int(p.split()[p.split().index("target") + 1]) % 2 == 0 for p in prompts]
        fresh = self.inner.generate(prompts, group_size, **kw)
        t = roll.response_ids.shape[-1]
        pad = t - fresh.response_ids.shape[-1]
        for b, k in enumerate(keep):
            if not k:
                roll.response_ids[b] = torch.nn.functional.pad(
                    fresh.response_ids[b], (0, pad), value=self.tok.pad_token_id
                )
                roll.response_mask[b] = torch.nn.functional.pad(fresh.response_mask[b], (0, pad))
                roll.logp[b] = torch.nn.functional.pad(fresh.logp[b], (0, pad))
                roll.texts[b] = fresh.texts[b]
        return roll


def _rows(d):
    out = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in out]


def test_dynamic_sampling_run_reports_its_rounds(tiny_model_path, tmp_path):
    factory = lambda c, m, t: HalfPlantingBackend(m, t)  # noqa: E731
    cfg = _config(tiny_model_path, "grpo", steps=3, format_score=0.0, prompts_per_step=2,
                  dynamic_sampling=True, max_resample_rounds=3, mask_truncated=True)  # fmt: skip
    hist = train(cfg, tmp_path / "a", backend_factory=factory, progress=False)
    for h in hist:
        assert 1 <= h["dynamic/rounds"] <= 4
        assert h["dynamic/prompts_sampled"] == 2 * h["dynamic/rounds"]
        assert h["dynamic/budget_exhausted"] in (0.0, 1.0)
        if h["dynamic/budget_exhausted"] == 0.0:
            assert h["dynamic/mixed_groups"] == 2.0
            assert h["charts/pass_rate"] == 1.0  # only the planted (mixed) groups are trained
        assert 0.0 <= h["overlong/masked_rate"] <= 1.0
    assert hist[-1]["charts/prompts_seen"] == sum(h["dynamic/prompts_sampled"] for h in hist)
    # Results are a function of the inputs: a second run repeats the first to the bit.
    train(cfg, tmp_path / "b", backend_factory=factory, progress=False)
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b")


def test_dynamic_sampling_says_when_the_budget_ran_out(tiny_model_path, tmp_path):
    # The plain sampler of a random model: every group all-wrong, so no round finds a mixed one.
    cfg = _config(tiny_model_path, "grpo", steps=2, format_score=0.0, dynamic_sampling=True,
                  max_resample_rounds=1)  # fmt: skip
    hist = train(cfg, tmp_path, progress=False)
    for h in hist:
        assert h["dynamic/rounds"] == 2.0 and h["dynamic/prompts_sampled"] == 4.0
        assert h["dynamic/budget_exhausted"] == 1.0 and h["dynamic/mixed_groups"] == 0.0
        assert h["charts/accuracy"] == 0.0  # trained on what it had: B uniform groups


def test_controls_resume_after_kill_bit_identical(tiny_model_path, tmp_path):
    factory = lambda c, m, t: HalfPlantingBackend(m, t)  # noqa: E731
    cfg = _config(tiny_model_path, "grpo", steps=4, save_every=2, format_score=0.0,
                  dynamic_sampling=True, max_resample_rounds=2, mask_truncated=True,
                  control={"adaptive_entropy": True, "entropy_target": 100.0,
                           "entropy_coef_delta": 0.01},
                  explore={"ucb_coef": 0.2, "batch_coef": 0.1})  # fmt: skip
    full = train(cfg, tmp_path / "full", backend_factory=factory, progress=False)
    # The coefficient starts at entropy_coef (0) and rises by delta per step below the target.
    assert [h["control/entropy_coef"] for h in full] == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert [h["control/next_entropy_coef"] for h in full] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert all(h["explore/bonus_mean"] != 0 for h in full)
    train(cfg, tmp_path / "killed", backend_factory=factory, stop_after=3, progress=False)
    train(cfg, tmp_path / "killed", resume=True, backend_factory=factory, progress=False)
    a, b = _rows(tmp_path / "full"), _rows(tmp_path / "killed")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert a == b  # bit-identical: coefficient, answer counts and data position restored
