"""The blocks of a training step that speak to the task (`llm.train.trainer`'s steps 1-2): the
rollout of G responses per prompt with the step's seed, the verifier's rewards, DSDR's diversity
scores, and DAPO dynamic sampling (rounds until B groups have mixed rewards; `llm.train.control`
decides which groups).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from llm.config import TrainConfig
from llm.data import Problem, data_indices
from llm.eval.diversity import diversity_scores
from llm.rollout.backend import RolloutBackendLike
from llm.rollout.base import Sampling
from llm.run.distributed import DistInfo, generate_shared
from llm.run.folder import NonFiniteError
from llm.tasks import TASKS
from llm.train import control

__all__ = ["DynamicRounds", "diversity", "dynamic_rollout", "rollout", "score", "step_seed"]


def rollout(
    backend: RolloutBackendLike,
    problems: list[Problem],
    cfg: TrainConfig,
    info: DistInfo,
    step: int,
    sampler_stats: bool,
    round_: int = 0,
) -> Any:
    """G responses to each problem's prompt (a `RolloutBatch`), sampled with the step's seed (and
    the dynamic-sampling round's, `round_` > 0); with `sampler_stats` also the sampler's
    entropies and top-N candidates (the behaviour values,
    `llm.train.behaviour.sampler_is_behaviour`)."""
    prompts = [TASKS[cfg.task].prompt(p, cfg.template) for p in problems]
    try:
        return generate_shared(
            backend,
            prompts,
            info,
            share=cfg.vllm.tensor_parallel_size if cfg.rollout.backend == "vllm" else 1,
            seed_of=lambda rank: step_seed(cfg.seed, step, rank, round_),
            group_size=cfg.rollout.group_size,
            sampling=Sampling(
                cfg.rollout.max_new_tokens,
                temperature=cfg.rollout.temperature,
                top_p=cfg.rollout.top_p,
                top_n=cfg.n_candidates if sampler_stats else 0,
                want_entropy=sampler_stats,
            ),
        )
    except RuntimeError as e:  # torch.multinomial on NaN/inf probabilities: a diverged policy
        if "inf" not in str(e) and "nan" not in str(e):
            raise
        raise NonFiniteError(
            f"step {step}: the policy's sampling probabilities are not finite ({e}); the newest "
            "checkpoint may already hold the diverged weights: resume from an earlier one"
        ) from e


def score(roll: Any, problems: list[Problem], cfg: TrainConfig, device: str) -> torch.Tensor:
    """The verifier's ``rewards (B, G)`` of the rollout's responses, float32 on `device`."""
    scores = [
        [TASKS[cfg.task].score(text, prob, format_score=cfg.format_score) for text in texts]
        for texts, prob in zip(roll.texts, problems, strict=True)
    ]
    return torch.tensor(scores, dtype=torch.float32, device=device)


def diversity(roll: Any, cfg: TrainConfig, encoder: Any) -> list[list[float]]:
    """DSDR's per-response diversity scores (B, G) of the rollout (`llm.eval.diversity`)."""
    return diversity_scores(roll.texts, task=cfg.task, encoder=encoder, distinct=cfg.distinct)


class DynamicRounds:
    """One run's DAPO dynamic sampling of a step, round by round: rounds of ``prompts_per_step``
    prompts (the data order's next ones, round r sampled with ``step_seed(seed, step, rank, r)``)
    until B groups have mixed rewards or ``1 + max_resample_rounds`` rounds are drawn
    (`llm.train.control.select_groups`). `dynamic_rollout` drives one run's rounds through a
    rollout backend; the batched engine drives several runs' rounds together
    (`llm.train.batched`).

    Attributes:
        position: the run's data position after the rounds drawn so far.
        rounds: ``(problems, rollout, rewards (B, G))`` of every round drawn, in order.
        done: the step's groups are chosen (`result` may be read).
    """

    def __init__(self, problems: list[Problem], position: int, cfg: TrainConfig) -> None:
        self.problems, self.position, self.cfg = problems, position, cfg
        self.rounds: list[tuple[list[Problem], Any, torch.Tensor]] = []
        self._mixed: list[bool] = []
        self._chosen: tuple[list[int], bool] | None = None

    @property
    def done(self) -> bool:
        return self._chosen is not None

    def next_problems(self) -> list[Problem]:
        """The next round's B problems (the data position moves past them)."""
        b = self.cfg.rollout.prompts_per_step
        idx = data_indices(self.position, b, len(self.problems), self.cfg.data.seed)
        self.position += b
        return [self.problems[i] for i in idx]

    def add(self, problems: list[Problem], roll: Any, rewards: torch.Tensor) -> None:
        """Record a round's rollout and ``rewards (B, G)``; the groups are chosen once B of them
        are mixed or no round is left."""
        self.rounds.append((problems, roll, rewards))
        self._mixed += control.mixed_groups(rewards).tolist()
        last = len(self.rounds) == 1 + self.cfg.rollout.max_resample_rounds
        self._chosen = control.select_groups(
            self._mixed, self.cfg.rollout.prompts_per_step, exhausted=last
        )

    def result(self, pad_id: int) -> tuple[list[Problem], Any, torch.Tensor, dict[str, float]]:
        """(problems, rollout, rewards (B, G), ``dynamic/`` metrics): the chosen B groups in draw
        order; the metrics give the rounds drawn, the prompts sampled, the mixed groups trained on
        and whether the budget ran out (then uniform groups fill the batch)."""
        assert self._chosen is not None  # select_groups decides on the last round
        picked, ran_out = self._chosen
        b = self.cfg.rollout.prompts_per_step
        per_round = [
            [i - k * b for i in picked if k * b <= i < (k + 1) * b] for k in range(len(self.rounds))
        ]
        roll = control.concat_rollouts(
            [(r_roll, ids) for (_, r_roll, _), ids in zip(self.rounds, per_round, strict=True)],
            pad_id,
        )
        rewards = torch.cat(
            [r_rew[ids] for (_, _, r_rew), ids in zip(self.rounds, per_round, strict=True)]
        )
        batch_problems = [self.rounds[i // b][0][i % b] for i in picked]
        metrics = {
            "dynamic/rounds": float(len(self.rounds)),
            "dynamic/prompts_sampled": float(len(self._mixed)),
            "dynamic/mixed_groups": float(sum(self._mixed[i] for i in picked)),
            "dynamic/budget_exhausted": float(ran_out),
        }
        return batch_problems, roll, rewards, metrics


def dynamic_rollout(
    backend: RolloutBackendLike,
    problems: list[Problem],
    position: int,
    cfg: TrainConfig,
    info: DistInfo,
    step: int,
    sampler_stats: bool,
    pad_id: int,
) -> tuple[list[Problem], Any, torch.Tensor, int, dict[str, float]]:
    """DAPO dynamic sampling of one run through `backend` (`DynamicRounds`).

    Returns:
        (problems, rollout, rewards (B, G), data position, ``dynamic/`` metrics): as
        `DynamicRounds.result`, and the data position after the rounds drawn.
    """
    rounds = DynamicRounds(problems, position, cfg)
    while not rounds.done:
        probs = rounds.next_problems()
        roll = rollout(backend, probs, cfg, info, step, sampler_stats, round_=len(rounds.rounds))
        rounds.add(probs, roll, score(roll, probs, cfg, info.device))
    batch_problems, roll, rewards, metrics = rounds.result(pad_id)
    return batch_problems, roll, rewards, rounds.position, metrics


def step_seed(seed: int, step: int, rank: int = 0, round_: int = 0) -> int:
    # Sampling uses a generator seeded per step (and rank, and dynamic-sampling round), so a
    # resumed run samples what it would have; rank 0's first round keeps the single-process seeds.
    key = (seed, 7919, step) if rank == 0 else (seed, 7919, step, rank)
    if round_ > 0:
        key = (seed, 7919, step, rank, round_)
    return int(np.random.default_rng(key).integers(2**62))
