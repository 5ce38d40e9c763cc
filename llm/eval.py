"""Evaluation of a model on Countdown or math: pass@k, distinct correct solutions, diversity.

For each problem, n responses are sampled; reported (means over problems):

- ``pass_at_k[k]`` for k = 1, 2, 4, ..., n (and n itself): the unbiased estimator of Chen et al.
  2021, `theory.measures.pass_at_k`, from the number of correct responses c of each problem;
- ``distinct_correct``: distinct correct solutions per problem (canonical forms,
  `llm.tasks.solution_key`), and ``solution_coverage``: that number over the solver's count;
- ``distinct_n[n]`` (n = 1..4): distinct n-grams over all n-grams of a problem's responses
  (whitespace tokens), the usual Distinct-n, computed per problem (diversity across problems is
  not what sharpening removes);
- ``self_bleu``: mean sentence BLEU (sacrebleu, effective order) of each response against the
  other responses of its problem, in [0, 1]; lower = more diverse;
- ``semantic_cosine_correct``: mean pairwise cosine of MiniLM embeddings among the correct
  responses of a problem (problems with >= 2 correct), when the `dsdr` extra is installed.

Math problems (`llm.tasks.math.MathProblem`, graded by math-verify) report the same pass@k,
Distinct-n, Self-BLEU and cosine entries, with ``distinct_answers`` (distinct boxed final answers
per problem, correct or not) in place of the Countdown solution counts.

`write_eval` merges one label's results into ``DIR/eval.json`` and redraws ``DIR/passk.png``.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm.tasks import (
    CountdownProblem,
    count_solutions,
    extract_answer,
    make_prompt,
    parse_expression,
    solution_key,
    verify,
)
from llm.tasks.math import MathProblem, compute_math_score, extract_boxed, make_math_prompt
from theory.measures import pass_at_k

__all__ = [
    "distinct_n",
    "evaluate",
    "evaluate_math",
    "k_values",
    "plot_pass_at_k",
    "self_bleu",
    "write_eval",
]


def k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else [*ks, n]


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct n-grams / all n-grams over `texts` (whitespace tokens); 0 when there are none."""
    grams = [
        tuple(words[i : i + n])
        for words in (t.split() for t in texts)
        for i in range(len(words) - n + 1)
    ]
    return len(set(grams)) / len(grams) if grams else 0.0


def self_bleu(texts: Sequence[str]) -> float | None:
    """Mean sentence BLEU in [0, 1] of each text against all the others (None if < 2 texts)."""
    if len(texts) < 2:
        return None
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=True)
    scores = [
        bleu.sentence_score(t, [o for j, o in enumerate(texts) if j != i]).score / 100.0
        for i, t in enumerate(texts)
    ]
    return float(np.mean(scores))


def _mean_pairwise_cosine(emb: np.ndarray) -> float:
    n = emb.shape[0]
    sims = emb @ emb.T
    return float((sims.sum() - np.trace(sims)) / (n * (n - 1)))


class _SharedMetrics:
    """The task-independent metrics of an evaluation, accumulated one problem at a time: unbiased
    pass@k, Distinct-1..4, Self-BLEU (optional) and the MiniLM cosine among correct responses."""

    def __init__(self, n: int, *, bleu: bool, encoder: Any | None) -> None:
        self.n, self.bleu, self.encoder = n, bleu, encoder
        self.ks = k_values(n)
        self.passk = np.zeros(len(self.ks))
        self.dist = np.zeros(4)
        self.bleus: list[float] = []
        self.cosines: list[float] = []
        self.m = 0

    def add(self, group: Sequence[str], correct: Sequence[str]) -> int:
        """One problem's `n` responses and its correct ones; returns the correct count c."""
        c = len(correct)
        self.m += 1
        self.passk += np.asarray([pass_at_k(self.n, c, k) for k in self.ks])
        self.dist += [distinct_n(group, m) for m in range(1, 5)]
        if self.bleu:
            sb = self_bleu(group)
            if sb is not None:
                self.bleus.append(sb)
        if self.encoder is not None and c >= 2:
            from llm.diversity import embed

            self.cosines.append(_mean_pairwise_cosine(embed(correct, self.encoder)))
        return c

    def result(self) -> dict[str, Any]:
        m = self.m
        return {
            "n": self.n,
            "n_problems": m,
            "pass_at_k": {str(k): float(v / m) for k, v in zip(self.ks, self.passk, strict=True)},
            "distinct_n": {str(i + 1): float(v / m) for i, v in enumerate(self.dist)},
            "self_bleu": float(np.mean(self.bleus)) if self.bleus else None,
            "semantic_cosine_correct": float(np.mean(self.cosines)) if self.cosines else None,
        }


def evaluate(
    backend: Any,
    problems: Sequence[CountdownProblem],
    *,
    n: int = 16,
    template: str = "compact",
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    prompts_per_batch: int = 8,
    distinct: str = "commutative",
    encoder: Any | None = None,
) -> dict[str, Any]:
    """Sample `n` responses per problem through `backend` (a `RolloutBackend`) and measure them.

    Returns:
        A JSON-ready dict: ``n``, ``n_problems``, ``pass_at_k`` ({str(k): float}),
        ``accuracy``, ``distinct_correct``, ``solution_coverage``, ``distinct_n`` ({"1".."4"}),
        ``self_bleu``, ``semantic_cosine_correct`` (None without an encoder or correct pairs),
        ``format_rate`` and ``per_problem`` (correct count and distinct correct per problem).

    Raises:
        ValueError: no problems, or `n < 1`.
    """
    texts = _sample_texts(
        backend,
        [make_prompt(p, template) for p in problems],
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        prompts_per_batch=prompts_per_batch,
    )

    shared = _SharedMetrics(n, bleu=True, encoder=encoder)
    per_problem, formats = [], []
    for prob, group in zip(problems, texts, strict=True):
        verdicts = [verify(t, prob) for t in group]
        correct = [t for t, v in zip(group, verdicts, strict=True) if v.reason == "correct"]
        keys = set()
        for t in correct:
            expr = parse_expression(extract_answer(t) or "")
            if expr is not None:
                keys.add(solution_key(expr, distinct=distinct))
        total = count_solutions(prob, distinct=distinct) if len(prob.nums) <= 5 else 0
        c = shared.add(group, correct)
        formats.append(np.mean([v.score > 0 for v in verdicts]))
        per_problem.append(
            {
                "nums": list(prob.nums),
                "target": prob.target,
                "correct": c,
                "distinct_correct": len(keys),
                "solutions": total,
            }
        )
    return {
        **shared.result(),
        "accuracy": float(np.mean([p["correct"] / n for p in per_problem])),
        "format_rate": float(np.mean(formats)),
        "distinct_correct": float(np.mean([p["distinct_correct"] for p in per_problem])),
        "solution_coverage": float(
            np.mean([p["distinct_correct"] / p["solutions"] for p in per_problem if p["solutions"]])
            if any(p["solutions"] for p in per_problem)
            else 0.0
        ),
        "per_problem": per_problem,
    }


def _sample_texts(
    backend: Any,
    prompts: Sequence[str],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int,
    prompts_per_batch: int,
) -> list[list[str]]:
    """`n` sampled texts per prompt, `prompts_per_batch` prompts per backend call.

    Raises:
        ValueError: no prompts, or `n < 1`.
    """
    if not prompts:
        raise ValueError("problems: expected at least one problem")
    if n < 1:
        raise ValueError(f"n: expected >= 1, got {n}")
    gen = torch.Generator().manual_seed(seed)
    texts: list[list[str]] = []
    for start in range(0, len(prompts), prompts_per_batch):
        roll = backend.generate(
            list(prompts[start : start + prompts_per_batch]),
            n,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            generator=gen,
        )
        texts.extend(roll.texts)
    return texts


def evaluate_math(
    backend: Any,
    problems: Sequence[MathProblem],
    *,
    n: int = 16,
    template: str = "qwen-math",
    max_new_tokens: int = 1024,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    prompts_per_batch: int = 8,
    bleu: bool = True,
    encoder: Any | None = None,
) -> dict[str, Any]:
    """Sample `n` responses per math problem through `backend` and grade them with math-verify.

    Returns:
        A JSON-ready dict: ``n``, ``n_problems``, ``pass_at_k`` ({str(k): float}, unbiased),
        ``accuracy``, ``boxed_rate`` (responses with a boxed answer), ``distinct_answers``
        (distinct boxed answers per problem, as strings), ``distinct_n``, ``self_bleu`` (None
        with ``bleu=False``), ``semantic_cosine_correct`` and ``per_problem`` (id, correct count,
        distinct answers).

    Raises:
        ValueError: no problems, or `n < 1`.
    """
    texts = _sample_texts(
        backend,
        [make_math_prompt(p, template) for p in problems],
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        prompts_per_batch=prompts_per_batch,
    )
    shared = _SharedMetrics(n, bleu=bleu, encoder=encoder)
    per_problem, boxed = [], []
    for prob, group in zip(problems, texts, strict=True):
        scores = [compute_math_score(t, prob) for t in group]
        answers = [extract_boxed(t) for t in group]
        correct = [t for t, sc in zip(group, scores, strict=True) if sc == 1.0]
        c = shared.add(group, correct)
        boxed.append(np.mean([a is not None for a in answers]))
        distinct = {" ".join(a.split()) for a in answers if a is not None}
        per_problem.append({"id": prob.id, "correct": c, "distinct_answers": len(distinct)})
    return {
        **shared.result(),
        "accuracy": float(np.mean([p["correct"] / n for p in per_problem])),
        "boxed_rate": float(np.mean(boxed)),
        "distinct_answers": float(np.mean([p["distinct_answers"] for p in per_problem])),
        "per_problem": per_problem,
    }


def write_eval(
    out_dir: str | os.PathLike[str], label: str, result: dict[str, Any], **info: Any
) -> Path:
    """Merge ``{label: result | info}`` into ``DIR/eval.json`` (atomically) and redraw
    ``DIR/passk.png`` with every label; returns the json path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "eval.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data[label] = {**info, **result}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    plot_pass_at_k(data, out / "passk.png")
    return path


def plot_pass_at_k(data: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """pass@k against k (log2 axis), one line per label of an eval.json mapping."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    markers = itertools.cycle("osD^v<>")
    for label, res in data.items():
        ks = [int(k) for k in res["pass_at_k"]]
        ax.plot(ks, list(res["pass_at_k"].values()), marker=next(markers), label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
