"""Tree-MDP environments: one tree, or many prompts with their own correct sets.

A tree MDP with `V` actions and depth `H` is a tiny language model: a state is a prefix, an action
is a token, a trajectory (a leaf, one of `M = V**H`) is a response, and a verifier rewards the
trajectories of a prompt's correct set `C_p` with 1. Node and trajectory numbering follow
`theory.trees` (depth-major internal nodes, trajectories in lexicographic order).

Prompts and how they share the policy. An environment holds `P` prompts, each with its own base
policy (logits `(P, N_int, V)`) and correct set (`(P, M)`); some prompts may be held out (never
sampled for training) to study generalization and pass@k on unseen prompts. The trained policy's
logits are

    logits[p] = base_logits[p] + θ_shared + θ_prompt[p]        # (P, N_int, V)

with `sharing` choosing which of the two trainable components exist (both start at 0, so the
initial policy is the base policy):

- ``"per_prompt"``: only `θ_prompt` (independent tabular policies; a held-out prompt never moves);
- ``"shared"``: only `θ_shared` (one policy for all prompts, which cannot tell them apart: the
  prompt changes only the base policy);
- ``"factored"``: both: the shared per-node component carries what transfers between prompts (e.g.
  trajectories correct for every prompt), the per-prompt component what does not.

This additive split is the simplest parameter sharing in which generalization to held-out prompts
is possible (through `θ_shared`) while each training prompt can still be fit exactly (through
`θ_prompt`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from theory import trees

SHARING = ("per_prompt", "shared", "factored")


@dataclass(frozen=True, eq=False)
class TreeEnv:
    """A tree MDP with `P` prompts (validated on construction).

    Attributes:
        num_actions: `V >= 2`.
        depth: `H >= 1` (the response length `T = H`).
        correct: `(P, M)` bool, the correct set of each prompt (non-empty for every prompt).
        base_logits: `(P, N_int, V)` float, finite: the base (reference, initial) policy.
        train_prompts: `(P,)` bool, at least one True: prompts sampled for training; the others
            are held out (evaluated only).
        sharing: one of `SHARING` (see the module docstring).

    Raises:
        ValueError: naming the field, for a bad shape, an empty correct set, non-finite logits,
            no training prompt or an unknown `sharing`.
    """

    num_actions: int
    depth: int
    correct: np.ndarray
    base_logits: np.ndarray
    train_prompts: np.ndarray
    sharing: str = "per_prompt"

    def __post_init__(self) -> None:
        v, h = self.num_actions, self.depth
        if not isinstance(v, int | np.integer) or v < 2:
            raise ValueError(f"num_actions must be an integer >= 2, got {v!r}")
        if not isinstance(h, int | np.integer) or h < 1:
            raise ValueError(f"depth must be an integer >= 1, got {h!r}")
        m, n_int = trees.num_trajectories(v, h), trees.num_internal_nodes(v, h)
        correct = np.asarray(self.correct)
        if correct.ndim == 1:
            correct = correct[None]
        if correct.ndim != 2 or correct.shape[1] != m:
            raise ValueError(f"correct must have shape (P, M={m}), got {np.shape(self.correct)}")
        if correct.dtype != bool and not np.isin(correct, (0, 1)).all():
            raise ValueError("correct must be a boolean mask (or 0/1)")
        correct = correct.astype(bool)
        empty = np.flatnonzero(~correct.any(axis=1))
        if empty.size:
            raise ValueError(f"correct: prompt(s) {empty.tolist()} have an empty correct set")
        num_prompts = correct.shape[0]
        base = np.asarray(self.base_logits, dtype=np.float64)
        if base.ndim == 2:
            base = np.broadcast_to(base, (num_prompts, *base.shape))
        if base.shape != (num_prompts, n_int, v):
            raise ValueError(
                f"base_logits must have shape (P={num_prompts}, N_int={n_int}, V={v}), "
                f"got {base.shape}"
            )
        if not np.isfinite(base).all():
            raise ValueError("base_logits must be finite")
        train = np.asarray(self.train_prompts)
        if train.shape != (num_prompts,) or train.dtype != bool:
            raise ValueError(f"train_prompts must be a bool array of shape ({num_prompts},)")
        if not train.any():
            raise ValueError("train_prompts must select at least one prompt")
        if self.sharing not in SHARING:
            raise ValueError(f"sharing must be one of {list(SHARING)}, got {self.sharing!r}")
        for name, arr in (("correct", correct), ("base_logits", base), ("train_prompts", train)):
            arr = np.array(arr)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    @property
    def num_prompts(self) -> int:
        """`P`."""
        return self.correct.shape[0]

    @property
    def num_trajectories(self) -> int:
        """`M = V**H`."""
        return self.num_actions**self.depth

    @property
    def num_internal_nodes(self) -> int:
        """`N_int = (V**H - 1)/(V - 1)`."""
        return trees.num_internal_nodes(self.num_actions, self.depth)

    @property
    def train_index(self) -> np.ndarray:
        """Indices of the training prompts, `(B,)` int (the batch axis of the sampled mode)."""
        return np.flatnonzero(self.train_prompts)

    def base_log_probs(self) -> np.ndarray:
        """Base-policy trajectory log-probabilities `(P, M)` (float64, via `theory.trees`)."""
        return trees.trajectory_log_probs(self.base_logits, self.num_actions, self.depth)


def _correct_mask(num_actions: int, depth: int, sets: Sequence[Sequence[object]]) -> np.ndarray:
    """`(P, M)` mask from per-prompt correct sets given as labels ("ACD") or trajectory indices."""
    m = trees.num_trajectories(num_actions, depth)
    labels = (
        {lab: i for i, lab in enumerate(trees.trajectory_labels(num_actions, depth))}
        if num_actions <= len(trees.ACTION_LETTERS)
        else {}
    )
    mask = np.zeros((len(sets), m), dtype=bool)
    for p, members in enumerate(sets):
        for item in members:
            if isinstance(item, str):
                if item not in labels:
                    raise ValueError(
                        f"correct: {item!r} (prompt {p}) is not a trajectory of the tree with "
                        f"V={num_actions}, H={depth}"
                    )
                mask[p, labels[item]] = True
            elif isinstance(item, int | np.integer) and 0 <= item < m:
                mask[p, item] = True
            else:
                raise ValueError(
                    f"correct: {item!r} (prompt {p}) is outside the tree (indices 0..{m - 1})"
                )
    return mask


def from_correct_sets(
    num_actions: int,
    depth: int,
    correct_sets: Sequence[Sequence[object]],
    base_logits: np.ndarray | None = None,
    train_prompts: Sequence[bool] | None = None,
    sharing: str = "per_prompt",
) -> TreeEnv:
    """An environment from per-prompt correct sets (labels like ``"ACD"`` or trajectory indices).

    Args:
        correct_sets: one collection per prompt.
        base_logits: `(N_int, V)` (shared by all prompts) or `(P, N_int, V)`; default uniform.
        train_prompts: `(P,)` bools; default all prompts train.

    Raises:
        ValueError: naming `correct` for a trajectory outside the tree, or any `TreeEnv` error.
    """
    if isinstance(correct_sets, str) or not len(correct_sets):
        raise ValueError("correct_sets must be a non-empty sequence of per-prompt sets")
    mask = _correct_mask(num_actions, depth, correct_sets)
    n_int = trees.num_internal_nodes(num_actions, depth)
    if base_logits is None:
        base_logits = np.zeros((n_int, num_actions))
    if train_prompts is None:
        train_prompts = np.ones(len(correct_sets), dtype=bool)
    return TreeEnv(
        num_actions, depth, mask, base_logits, np.asarray(train_prompts, dtype=bool), sharing
    )


def single_tree(instance: trees.TreeInstance) -> TreeEnv:
    """One prompt from a `theory.trees.TreeInstance` (its base policy realized as logits)."""
    logits = trees.logits_from_log_probs(instance.log_pb, instance.num_actions, instance.depth)
    return TreeEnv(
        instance.num_actions,
        instance.depth,
        instance.correct[None],
        logits[None],
        np.ones(1, dtype=bool),
    )


def casp_env(base_logits: np.ndarray | None = None) -> TreeEnv:
    """The CaSP toy (seed 004, Fig. 5) via `theory.trees.casp_tree()`: V=4, H=3, six correct.

    The base policy is uniform unless `base_logits` `(21, 4)` is given (the paper publishes none).
    """
    tree = trees.casp_tree()
    n_int = trees.num_internal_nodes(tree.num_actions, tree.depth)
    base = np.zeros((n_int, tree.num_actions)) if base_logits is None else base_logits
    return TreeEnv(tree.num_actions, tree.depth, tree.correct[None], base, np.ones(1, dtype=bool))


def multi_prompt_env(
    rng: np.random.Generator,
    num_prompts: int = 8,
    num_heldout: int = 0,
    num_actions: int = 3,
    depth: int = 3,
    correct_size: int = 4,
    shared_size: int = 0,
    skew: float = 1.0,
    sharing: str = "factored",
) -> TreeEnv:
    """Random prompts for generalization and pass@k studies.

    Every prompt's correct set holds `shared_size` trajectories common to all prompts (a skill
    that transfers) and `correct_size - shared_size` of its own, drawn at random. Base logits are
    i.i.d. `Normal(0, skew²)` per prompt (`theory.trees.random_base_logits`). The last
    `num_heldout` prompts are held out.

    Raises:
        ValueError: naming the argument, for sizes out of range.
    """
    m = trees.num_trajectories(num_actions, depth)
    if not 1 <= num_prompts:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts!r}")
    if not 0 <= num_heldout < num_prompts:
        raise ValueError(f"num_heldout must be in [0, num_prompts), got {num_heldout!r}")
    if not 1 <= correct_size <= m:
        raise ValueError(f"correct_size must be in [1, M={m}], got {correct_size!r}")
    if not 0 <= shared_size <= correct_size:
        raise ValueError(f"shared_size must be in [0, correct_size], got {shared_size!r}")
    perm = rng.permutation(m)
    common, rest = perm[:shared_size], perm[shared_size:]
    correct = np.zeros((num_prompts, m), dtype=bool)
    correct[:, common] = True
    for p in range(num_prompts):
        correct[p, rng.choice(rest, size=correct_size - shared_size, replace=False)] = True
    base = np.stack(
        [trees.random_base_logits(rng, num_actions, depth, skew) for _ in range(num_prompts)]
    )
    train = np.arange(num_prompts) < num_prompts - num_heldout
    return TreeEnv(num_actions, depth, correct, base, train, sharing)
