"""Driver-level controls of issue 39 (`llm.train.control`): DAPO dynamic sampling and overlong
masking, the adaptive entropy coefficient, outcome-based exploration bonuses, the KL penalty in
the reward, the adaptive KL coefficient and the reference reset; their pure functions on
hand-made inputs, and short runs through the real loop (metrics, determinism, exact resume)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from llm.rollout.base import RolloutBatch
from llm.train import control
from llm.train.rollout_step import step_seed
from llm.train.trainer import train
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


class _TrlEntropy:
    """TRL ``GRPOTrainer``'s adaptive entropy control, from its documented behaviour: the loss
    applies ``entropy_coef`` only when the previous optimizer step's entropy (``+inf`` before
    the first) is at or below the target; after the step the coefficient moves by delta (up at
    or below the target, down above), clamped."""

    def __init__(self, coef: float, target: float, delta: float, lo: float, hi: float):
        self.coef, self.target, self.delta, self.lo, self.hi = coef, target, delta, lo, hi
        self.last = math.inf

    def step(self, entropy: float) -> tuple[float, float]:
        applied = self.coef if self.last <= self.target else 0.0
        up = entropy <= self.target
        self.coef = min(max(self.coef + (self.delta if up else -self.delta), self.lo), self.hi)
        self.last = entropy
        return applied, self.coef


class _SkyworkEntController:
    """Skywork-OR1's ``EntController`` (its verl fork), from its code's behaviour: the term is on
    (``entropy_loss_enabled``, 1 at the start) while the last measured entropy is strictly
    below the target; the update raises the value only strictly below, else lowers it."""

    def __init__(self, coef: float, target: float, delta: float, lo: float, hi: float):
        self.value, self.target, self.delta, self.lo, self.hi = coef, target, delta, lo, hi
        self.enabled = 1

    def step(self, entropy: float) -> tuple[float, float]:
        applied = self.value * self.enabled
        self.value += self.delta if entropy < self.target else -self.delta
        self.value = float(np.clip(self.value, self.lo, self.hi))
        self.enabled = int(entropy < self.target)
        return applied, self.value


# A worked example: 12 steps around the target 0.2, twice exactly at it.
_ENTROPIES = [0.35, 0.18, 0.25, 0.2, 0.1, 0.3, 0.19, 0.21, 0.2, 0.15, 0.4, 0.05]


def _package(gate: str, coef: float, **kw: float) -> list[tuple[float, float]]:
    out, last = [], None
    for e in _ENTROPIES:
        applied = control.applied_entropy_coef(coef, e, target=kw["target"], gate=gate,
                                               previous=last)  # fmt: skip
        coef = control.next_entropy_coef(coef, e, strict=gate == "skywork", **kw)
        out.append((applied, coef))
        last = e
    return out


@pytest.mark.parametrize(
    ("gate", "reference", "defaults"),
    [("trl", _TrlEntropy, (0.0, 0.2, 0.005, 0.0, 1.0)),  # TRL's defaults
     ("skywork", _SkyworkEntController, (0.0, 0.2, 1e-4, 0.0, 0.005))],  # the authors' scripts
)  # fmt: skip
def test_entropy_gate_equals_the_reference_controller(gate, reference, defaults):
    """Issue 54: the step's own entropy gated the term; TRL and Skywork-OR1 gate with the
    previous step's, and the authors lower the coefficient at equality (strict ``<``). With
    ``control.entropy_gate`` = trl / skywork the coefficients equal the references', step by
    step, at their own defaults."""
    coef, target, delta, lo, hi = defaults
    ref = reference(coef, target, delta, lo, hi)
    want = [ref.step(e) for e in _ENTROPIES]
    got = _package(gate, coef, target=target, delta=delta, lo=lo, hi=hi)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    # Before any step: TRL's term is off, the authors' on.
    first = control.applied_entropy_coef(0.1, 0.5, target=0.2, gate=gate, previous=None)
    assert first == (0.1 if gate == "skywork" else 0.0)
    # The default gate (this step's entropy) applies another coefficient at 7 (TRL's) and 9 (the
    # authors') of these 12 steps.
    step = _package("step", coef, target=target, delta=delta, lo=lo, hi=hi)
    differ = sum(a != b for (a, _), (b, _) in zip(step, got, strict=True))
    assert differ == {"trl": 7, "skywork": 9}[gate]
    with pytest.raises(ValueError, match=r"control\.entropy_gate: expected one of"):
        control.applied_entropy_coef(0.1, 0.1, target=0.2, gate="previous")


@pytest.mark.parametrize("gate", ["trl", "skywork"])
def test_entropy_gate_in_the_loop_and_its_resume(gate, tiny_model_path, tmp_path):
    """Through the real loop: each step's applied coefficient is the reference controller's fed
    the loop's own entropies, and a killed run resumes bit-identically (the previous entropy is
    checkpointed)."""
    factory = lambda c, m, t: PlantingBackend(m, t)  # noqa: E731
    ctl = {"adaptive_entropy": True, "entropy_gate": gate, "entropy_coef_delta": 0.01}
    probe = train(_config(tiny_model_path, "grpo", steps=2, control=ctl), tmp_path / "probe",
                  backend_factory=factory, progress=False)  # fmt: skip
    # The target between the first two steps' entropies: the gate switches within the run.
    ctl["entropy_target"] = sum(h["control/entropy"] for h in probe) / 2
    cfg = _config(tiny_model_path, "grpo", steps=4, save_every=2, entropy_coef=0.05, control=ctl)
    full = train(cfg, tmp_path / "full", backend_factory=factory, progress=False)
    ref = (_TrlEntropy if gate == "trl" else _SkyworkEntController)(
        0.05, ctl["entropy_target"], 0.01, 0.0, 1.0
    )
    for h in full:
        applied, following = ref.step(h["control/entropy"])
        assert h["control/entropy_coef"] == pytest.approx(applied, abs=1e-15)
        assert h["control/next_entropy_coef"] == pytest.approx(following, abs=1e-15)
    train(cfg, tmp_path / "killed", backend_factory=factory, stop_after=3, progress=False)
    train(cfg, tmp_path / "killed", resume=True, backend_factory=factory, progress=False)
    assert _rows(tmp_path / "full") == _rows(tmp_path / "killed")


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
    assert step_seed(0, 3) == step_seed(0, 3, 0, 0)  # round 0 keeps the plain step seed
    seeds = {step_seed(0, 3, 0, r) for r in range(5)} | {step_seed(0, 3, 1)}
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


# ---------------------------------------------------------------------------------------------
# KL penalty in the reward, adaptive KL coefficient, reference reset (docs/formulas.md §2.35-§2.37)


def _token_kl(lo: float, lr: float, estimator: str) -> float:
    """One token's estimate of KL(pi_old || pi_ref) from the two log-probs (Schulman 2020)."""
    d = lo - lr
    return {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) + d - 1}[estimator]


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_reward_penalty_sums_the_token_estimates(estimator):
    g = torch.Generator().manual_seed(3)
    b, gs, t = 2, 3, 5
    logp_old = -torch.rand(b, gs, t, generator=g) * 3
    logp_ref = -torch.rand(b, gs, t, generator=g) * 3
    lengths = torch.tensor([[5, 2, 0], [1, 4, 3]])
    mask = (torch.arange(t) < lengths[..., None]).float()
    logp_old[mask == 0] = float("nan")  # padding may hold anything
    total, mean = control.kl_reward_penalty(logp_old, logp_ref, mask, estimator=estimator)
    for i, j in itertools.product(range(b), range(gs)):
        n = int(lengths[i, j])
        want = sum(
            _token_kl(float(logp_old[i, j, k]), float(logp_ref[i, j, k]), estimator)
            for k in range(n)
        )
        assert float(total[i, j]) == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert float(mean[i, j]) == pytest.approx(want / max(n, 1), rel=1e-5, abs=1e-6)
    assert float(total[0, 2]) == 0.0 and float(mean[0, 2]) == 0.0  # an empty response


class _VerlAdaptiveKL:
    """Ziegler et al. 2019's controller as verl's ``AdaptiveKLController`` states it
    (verl/trainer/ppo/core_algos.py; read, not copied)."""

    def __init__(self, value: float, target: float, horizon: int):
        self.value, self.target, self.horizon = value, target, horizon

    def update(self, kl: float, n: int) -> None:
        err = np.clip(kl / self.target - 1, -0.2, 0.2)
        self.value *= 1 + err * n / self.horizon


def test_adaptive_kl_coefficient_follows_the_proportional_controller():
    ref = _VerlAdaptiveKL(0.05, 0.1, 100)
    coef = 0.05
    for kl in [0.0, 0.05, 0.1, 0.11, 0.3, -0.02, 0.09]:
        coef = control.next_kl_coef(coef, kl, target=0.1, horizon=100, n_steps=8)
        ref.update(kl, 8)
        assert coef == ref.value  # the same double arithmetic
    # Clipped at +-20 % per horizon: far above the target it grows by 0.2 n / H, no more.
    assert control.next_kl_coef(1.0, 5.0, target=0.1, horizon=10, n_steps=5) == pytest.approx(1.1)
    assert control.next_kl_coef(1.0, 0.0, target=0.1, horizon=10, n_steps=5) == pytest.approx(0.9)
    assert control.next_kl_coef(1.0, 0.1, target=0.1, horizon=10, n_steps=5) == 1.0
    with pytest.raises(ValueError, match="horizon"):
        control.next_kl_coef(1.0, 0.1, target=0.1, horizon=0, n_steps=5)


def test_reset_reference_copies_the_policy(tmp_path):
    from llm.model.load import load_model
    from tests.llm.conftest import save_random_tiny_model

    path = save_random_tiny_model(tmp_path / "a")
    policy, reference = load_model(path, "cpu"), load_model(path, "cpu")
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    control.reset_reference(reference, policy)
    ref_state = reference.state_dict()
    assert ref_state.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(ref_state[k], v), k
        assert torch.equal(policy.state_dict()[k], v), k  # the policy is left as it was


def _kl_config(model_path, **over):
    control_keys = {"kl_in_reward": True, "kl_reward_coef": 0.05}
    control_keys.update(over.pop("control", {}))
    return _config(model_path, "grpo", control=control_keys, **over)


def _spy_steps(monkeypatch):
    """Record, per step, the behaviour batch the trainer built (rewards before any control) and
    the batch the update trained on."""
    from llm.train import loop, trainer

    seen: list[dict] = []
    build, update = loop.behaviour_batch, trainer.update_policy

    def spy_build(*args, **kw):
        batch = build(*args, **kw)
        seen.append({"rewards": batch.fixed["rewards"].clone(), "built": batch})
        return batch

    def spy_update(policy, optimizer, scheduler, batch, **kw):
        seen[-1]["trained"] = batch
        return update(policy, optimizer, scheduler, batch, **kw)

    monkeypatch.setattr(loop, "behaviour_batch", spy_build)
    monkeypatch.setattr(trainer, "update_policy", spy_update)
    return seen


def test_kl_in_reward_shifts_each_reward_by_beta_times_the_summed_kl(
    tiny_model_path, tmp_path, monkeypatch
):
    from llm.model.forward import forward_all
    from llm.model.load import load_model

    seen = _spy_steps(monkeypatch)
    factory = lambda c, m, t: PlantingBackend(m, t)  # noqa: E731
    cfg = _kl_config(tiny_model_path, steps=3)
    hist = train(cfg, tmp_path, backend_factory=factory, progress=False)
    base = load_model(tiny_model_path, "cpu")  # the reference, loaded here on its own
    moved = 0
    for h, s in zip(hist, seen, strict=True):
        built, trained = s["built"], s["trained"]
        b, g, t = built.shape
        ref = forward_all(base, built.rows, 5, temperature=cfg.rollout.temperature)
        logp_ref = ref.logp.reshape(b, g, t).double()
        logp_old, mask = built.fixed["logp_old"].double(), built.fixed["mask"].double()
        kl_sum = ((logp_old - logp_ref) * mask).sum(-1)  # k1, summed over each response
        shift = s["rewards"].double() - trained.fixed["rewards"].double()
        # float32 sums of <= T terms each |logp| < 30: a loose bound is plenty here.
        torch.testing.assert_close(shift, 0.05 * kl_sum, rtol=0, atol=1e-5)
        assert "logp_ref" not in trained.fixed  # kl_coef = 0: the loss batch is unchanged
        assert h["control/kl_reward_coef"] == 0.05
        kl_mean = ((logp_old - logp_ref) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        assert h["control/kl"] == pytest.approx(float(kl_mean.mean()), abs=1e-6)
        assert h["control/kl_penalty"] == pytest.approx(float(shift.mean()), abs=1e-6)
        # The charts read the verifier's rewards, the advantages the penalised ones.
        assert h["charts/reward_mean"] == pytest.approx(float(s["rewards"].mean()))
        moved += bool(shift.abs().max() > 0)
    assert hist[0]["control/kl"] == 0.0  # step 1: pi_old is the base model itself
    assert moved >= 1


def test_adaptive_kl_coefficients_follow_the_controller_in_the_loop(tiny_model_path, tmp_path):
    factory = lambda c, m, t: PlantingBackend(m, t)  # noqa: E731
    cfg = _kl_config(tiny_model_path, steps=4, kl_coef=0.02,
                     control={"adaptive_kl": True, "kl_target": 1e-3, "kl_horizon": 40})  # fmt: skip
    hist = train(cfg, tmp_path, backend_factory=factory, progress=False)
    n = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    reward_ctl = _VerlAdaptiveKL(0.05, 1e-3, 40)
    loss_ctl = _VerlAdaptiveKL(0.02, 1e-3, 40)
    for h in hist:
        assert h["control/kl_reward_coef"] == reward_ctl.value
        assert h["control/kl_coef"] == loss_ctl.value
        reward_ctl.update(h["control/kl"], n)
        loss_ctl.update(h["control/kl"], n)
        assert h["control/next_kl_reward_coef"] == reward_ctl.value
        assert h["control/next_kl_coef"] == loss_ctl.value
    assert hist[1]["control/kl_coef"] != hist[0]["control/kl_coef"]


def test_reference_reset_makes_the_reference_the_policy_of_the_reset_step(
    tiny_model_path, tmp_path
):
    from safetensors.torch import load_file

    factory = lambda c, m, t: PlantingBackend(m, t)  # noqa: E731
    cfg = _kl_config(tiny_model_path, steps=3, save_every=2, behaviour_pass="always",
                     control={"reference_reset_every": 2})  # fmt: skip
    hist = train(cfg, tmp_path, backend_factory=factory, progress=False)
    assert [h["control/reference_step"] for h in hist] == [0.0, 2.0, 2.0]
    # Steps 1 and 3 sample from the reference itself (the base model, then the policy after the
    # reset of step 2): the same weights through the same forward, so the KL is exactly 0.
    assert hist[0]["control/kl"] == 0.0 and hist[2]["control/kl"] == 0.0
    assert hist[1]["control/kl"] != 0.0
    ckpt = tmp_path / "checkpoints" / "step_000002"
    policy = load_file(ckpt / "model.safetensors")
    reference = load_file(ckpt / "reference" / "model.safetensors")
    assert policy.keys() == reference.keys()
    assert all(torch.equal(policy[k], reference[k]) for k in policy)


@pytest.mark.parametrize(
    "control_keys",
    [
        {"kl_in_reward": True},
        {"kl_in_reward": True, "adaptive_kl": True, "kl_target": 1e-3, "kl_horizon": 40},
        {"kl_in_reward": False, "adaptive_kl": True, "kl_horizon": 40},
        {"kl_in_reward": False, "reference_reset_every": 1, "reset_optimizer": True},
    ],
    ids=["in_reward", "adaptive_reward", "adaptive_loss", "reset"],
)
def test_kl_controls_run_finite(control_keys, tiny_model_path, tmp_path):
    factory = lambda c, m, t: PlantingBackend(m, t)  # noqa: E731
    cfg = _kl_config(tiny_model_path, kl_coef=0.01, control=control_keys)
    hist = train(cfg, tmp_path, backend_factory=factory, progress=False)
    for h in hist:
        assert all(np.isfinite(v) for v in h.values()), h
        assert h["charts/grad_norm"] > 0


def test_kl_controls_resume_after_kill_bit_identical(tiny_model_path, tmp_path):
    from safetensors.torch import load_file

    factory = lambda c, m, t: PlantingBackend(m, t)  # noqa: E731
    cfg = _kl_config(tiny_model_path, steps=5, save_every=3, kl_coef=0.02,
                     control={"adaptive_kl": True, "kl_target": 1e-3, "kl_horizon": 40,
                              "reference_reset_every": 2, "reset_optimizer": True})  # fmt: skip
    train(cfg, tmp_path / "full", backend_factory=factory, progress=False)
    # Killed after step 4: the checkpoint of step 3 holds the coefficients and the reference
    # reset at step 2; the resumed run resets again at step 4.
    train(cfg, tmp_path / "killed", backend_factory=factory, stop_after=4, progress=False)
    ckpt = tmp_path / "killed" / "checkpoints" / "step_000003"
    assert (ckpt / "reference" / "model.safetensors").is_file()
    train(cfg, tmp_path / "killed", resume=True, backend_factory=factory, progress=False)
    a, b = _rows(tmp_path / "full"), _rows(tmp_path / "killed")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    assert [r["control/reference_step"] for r in b] == [0.0, 2.0, 2.0, 4.0, 4.0]
    assert a == b  # bit-identical: coefficients, reference and optimizer state restored
    last = "checkpoints/step_000005"
    for name in ("model.safetensors", "reference/model.safetensors"):
        wa, wb = (load_file(d / last / name) for d in (tmp_path / "full", tmp_path / "killed"))
        assert all(torch.equal(wa[k], wb[k]) for k in wa), name


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"control": {"adaptive_kl": True}}, r"control\.adaptive_kl: expected false unless"),
        ({"control": {"reference_reset_every": 5}}, r"control\.reference_reset_every: .* got 5"),
        ({"kl_coef": 0.1, "control": {"reset_optimizer": True}}, r"control\.reset_optimizer"),
        (
            {"control": {"kl_in_reward": True, "adaptive_kl": True, "kl_reward_coef": 0.0}},
            r"control\.kl_reward_coef: expected a number > 0 .* got 0\.0",
        ),
        ({"control": {"kl_reward_estimator": "k3+"}}, r"control\.kl_reward_estimator"),
        ({"control": {"kl_horizon": 0}}, r"control\.kl_horizon"),
        ({"control": {"kl_target": 0.0}}, r"control\.kl_target"),
        ({"control": {"kl_reward_coef": -1.0}}, r"control\.kl_reward_coef"),
    ],
)
def test_kl_control_keys_are_checked(over, match, tiny_model_path):
    with pytest.raises(ValueError, match=match):
        _config(tiny_model_path, "grpo", **over)


def test_batched_trainer_takes_the_kl_controls(tiny_model_path):
    """The one loop applies them to every run of a batch (as alone, to the bit:
    tests/llm/test_batched.py), so `batchable` lets them in."""
    from llm.train.batched import batchable

    assert batchable(_config(tiny_model_path, "grpo", kl_coef=0.1)) is None
    for keys in [{"kl_in_reward": True}, {"adaptive_kl": True}, {"reference_reset_every": 3}]:
        assert batchable(_config(tiny_model_path, "grpo", kl_coef=0.1, control=keys)) is None
