"""The toy sweep's environments (`environments`): one `TreeEnv` per dataset draw of an ``[env]``
table (`toymdp.sweep_spec.EnvSpec`): figure 6's popularity dataset with its constants as arguments
(`popularity_dataset`; `toymdp.experiments.passk.toy_dataset` is the figure's own), or a single
prompt (`single_prompt`).
"""

from __future__ import annotations

import numpy as np

from theory import trees
from toymdp.env import TreeEnv
from toymdp.sweep_spec import EnvSpec

__all__ = ["environments", "popularity_dataset", "single_prompt"]


def _tilt(log_pb: np.ndarray, correct: np.ndarray, target: float) -> np.ndarray:
    """Rescale each row's mass on `C` to `target` (and off `C` to `1 − target`), keeping the
    base policy's preferences within `C` and within its complement (as figure 6)."""
    log_pc = np.logaddexp.reduce(np.where(correct, log_pb, -np.inf), axis=-1, keepdims=True)
    log_pw = np.logaddexp.reduce(np.where(correct, -np.inf, log_pb), axis=-1, keepdims=True)
    return np.where(correct, np.log(target) + log_pb - log_pc, np.log1p(-target) + log_pb - log_pw)


def popularity_dataset(rng: np.random.Generator, spec: EnvSpec) -> TreeEnv:
    """Figure 6's popularity dataset (`toymdp.experiments.passk.toy_dataset`) with its constants
    as arguments: `per_size` training then `per_size` held-out prompts per multiplicity.

    Returns:
        A `TreeEnv` with `P = 2·per_size·len(multiplicities)` prompts, `sharing="factored"`.
    """
    v, h = spec.num_actions, spec.depth
    m = trees.num_trajectories(v, h)
    popularity = np.empty(m)
    popularity[rng.permutation(m)] = 1.0 / np.arange(1, m + 1) ** spec.zipf
    popularity /= popularity.sum()
    sizes = np.tile(np.repeat(spec.multiplicities, spec.per_size), 2)  # (P,)
    correct = np.zeros((sizes.size, m), dtype=bool)
    for p, size in enumerate(sizes):
        correct[p, rng.choice(m, size=size, replace=False, p=popularity)] = True
    log_pb = trees.trajectory_log_probs(
        np.stack([trees.random_base_logits(rng, v, h, spec.skew) for _ in sizes]), v, h
    )
    if spec.base_correctness and not correct.all():
        log_pb = _tilt(log_pb, correct, float(spec.base_correctness))
    base = trees.logits_from_log_probs(log_pb, v, h)
    train = np.arange(sizes.size) < sizes.size // 2
    return TreeEnv(v, h, correct, base, train, sharing="factored")


def single_prompt(rng: np.random.Generator, spec: EnvSpec) -> TreeEnv:
    """One prompt: correct set by labels or drawn at random, base uniform (`skew = 0`) or random."""
    v, h = spec.num_actions, spec.depth
    m = trees.num_trajectories(v, h)
    correct = np.zeros((1, m), dtype=bool)
    if spec.correct:
        labels = {lab: i for i, lab in enumerate(trees.trajectory_labels(v, h))}
        for item in spec.correct:
            if item not in labels:
                raise ValueError(f"env.correct: {item!r} is not a trajectory of V={v}, H={h}")
            correct[0, labels[item]] = True
    else:
        correct[0, rng.choice(m, size=spec.correct_size, replace=False)] = True
    n_int = trees.num_internal_nodes(v, h)
    logits = (
        trees.random_base_logits(rng, v, h, spec.skew) if spec.skew > 0 else np.zeros((n_int, v))
    )
    log_pb = trees.trajectory_log_probs(logits[None], v, h)
    if spec.base_correctness and not correct.all():
        log_pb = _tilt(log_pb, correct, float(spec.base_correctness))
    base = trees.logits_from_log_probs(log_pb, v, h)
    return TreeEnv(v, h, correct, base, np.ones(1, dtype=bool))


def environments(spec: EnvSpec) -> list[TreeEnv]:
    """One environment per draw seed (`spec.draws`)."""
    build = popularity_dataset if spec.kind == "dataset" else single_prompt
    return [build(np.random.default_rng(d), spec) for d in spec.draws]
