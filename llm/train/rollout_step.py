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

__all__ = ["diversity", "dynamic_rollout", "rollout", "score", "step_seed"]


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
    """DAPO dynamic sampling: rounds of ``prompts_per_step`` prompts (the data order's next ones,
    each round with its own seed) until B groups have mixed rewards or
    ``1 + max_resample_rounds`` rounds are drawn (`llm.train.control.select_groups`).

    Returns:
        (problems, rollout, rewards (B, G), data position, ``dynamic/`` metrics): the chosen B
        groups in draw order; the metrics give the rounds drawn, the prompts sampled, the mixed
        groups trained on and whether the budget ran out (then uniform groups fill the batch).
    """
    b = cfg.rollout.prompts_per_step
    rounds: list[tuple[list[Problem], Any, torch.Tensor]] = []
    mixed: list[bool] = []
    n_rounds = 1 + cfg.rollout.max_resample_rounds
    chosen = None
    for r in range(n_rounds):
        idx = data_indices(position, b, len(problems), cfg.data.seed)
        position += b
        probs = [problems[i] for i in idx]
        roll = rollout(backend, probs, cfg, info, step, sampler_stats, round_=r)
        rewards = score(roll, probs, cfg, info.device)
        rounds.append((probs, roll, rewards))
        mixed += control.mixed_groups(rewards).tolist()
        chosen = control.select_groups(mixed, b, exhausted=r + 1 == n_rounds)
        if chosen is not None:
            break
    assert chosen is not None  # select_groups decides on the last round
    picked, ran_out = chosen
    per_round = [
        [i - k * b for i in picked if k * b <= i < (k + 1) * b] for k in range(len(rounds))
    ]
    roll = control.concat_rollouts(
        [(r_roll, ids) for (_, r_roll, _), ids in zip(rounds, per_round, strict=True)], pad_id
    )
    rewards = torch.cat([r_rew[ids] for (_, _, r_rew), ids in zip(rounds, per_round, strict=True)])
    batch_problems = [rounds[i // b][0][i % b] for i in picked]
    metrics = {
        "dynamic/rounds": float(len(rounds)),
        "dynamic/prompts_sampled": float(len(mixed)),
        "dynamic/mixed_groups": float(sum(mixed[i] for i in picked)),
        "dynamic/budget_exhausted": float(ran_out),
    }
    return batch_problems, roll, rewards, position, metrics


def step_seed(seed: int, step: int, rank: int = 0, round_: int = 0) -> int:
    # Sampling uses a generator seeded per step (and rank, and dynamic-sampling round), so a
    # resumed run samples what it would have; rank 0's first round keeps the single-process seeds.
    key = (seed, 7919, step) if rank == 0 else (seed, 7919, step, rank)
    if round_ > 0:
        key = (seed, 7919, step, rank, round_)
    return int(np.random.default_rng(key).integers(2**62))
