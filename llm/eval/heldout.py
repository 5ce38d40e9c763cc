"""Evaluation of a model on any registered task (`llm.tasks.TASKS`): pass@k, maj@k, distinct
answers, answer entropy, diversity, and (opt-in) token entropy and KL to a base model.

For each problem, n responses are sampled; reported (means over problems):

- ``pass_at_k[k]`` for k = 1, 2, 4, ..., n (and n itself): the unbiased estimator of Chen et al.
  2021, `theory.measures.pass_at_k`, from the number of correct responses c of each problem;
  with n = 256 the curve of Yue et al. 2025 (arXiv 2504.13837), where the base model overtakes RL;
- ``maj_at_k[k]`` for the same k: majority-vote accuracy (self-consistency, Wang et al. 2022) over
  ``task.answer_key``, the exact expectation over k-subsets of the n responses, ties scored by
  their expectation under a uniform tie-break, no-answer responses not voting
  (`llm.eval.answers.maj_at_k`);
- ``answer_entropy`` (nats) of a problem's answer keys (no answer = one more key) and
  ``effective_answers``, its exponential (`llm.eval.answers.answer_entropy`);
- ``token_entropy`` (nats per generated token) of the sampler and, given a reference model,
  ``kl_to_reference`` (exact KL over the vocabulary per generated token), from a teacher-forced
  forward after sampling (`llm.eval.token_stats`; opt-in, None otherwise);
- ``distinct_correct``: distinct correct answers per problem (equal ``task.answer_key``; for
  Countdown the canonical forms of `llm.tasks.solution_key`), ``distinct_answers``: distinct
  answers correct or not, and, for tasks that count their solutions (Countdown),
  ``solution_coverage``: distinct correct over the solver's count;
- ``format_rate``: responses that are well-formed (scored above 0 with a format score; for math
  those with a boxed answer, also reported as ``boxed_rate``);
- ``distinct_n[n]`` (n = 1..4): distinct n-grams over all n-grams of a problem's responses
  (whitespace tokens), the usual Distinct-n, computed per problem (diversity across problems is
  not what sharpening removes);
- ``self_bleu``: mean sentence BLEU (sacrebleu, effective order) of each response against the
  other responses of its problem, in [0, 1]; lower = more diverse;
- ``semantic_cosine_correct``: mean pairwise cosine of MiniLM embeddings among the correct
  responses of a problem (problems with >= 2 correct), when the `dsdr` extra is installed.

`llm.eval.written.write_eval` writes what ``python -m llm eval`` reports (eval.json, passk.png).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from sacrebleu.metrics import BLEU

from llm.eval.answers import answer_counts, answer_entropy, maj_at_k
from llm.eval.diversity import embed
from llm.eval.token_stats import token_entropy_kl
from llm.model.stacked import StackedLM
from llm.model.tokens import check_vocabulary
from llm.rollout.base import Sampling
from llm.rollout.stacked import sample_groups
from llm.tasks import TASKS, Problem, Task
from theory.measures import pass_at_k

__all__ = [
    "distinct_n",
    "evaluate",
    "evaluate_models",
    "k_values",
    "self_bleu",
    "self_bleu_reference",
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
    """Mean sentence BLEU in [0, 1] of each text against all the others (None if < 2 texts).

    A text's score depends on the multiset of the others only (sacrebleu clips each n-gram by its
    largest count in any reference and takes the closest reference length: both ignore order),
    so equal texts share one `sentence_score` call: a sharpened policy's 16 samples hold a few
    distinct texts, and this is 60% of an evaluation's time without it (measured on the tiny
    model). Equal, to the bit, to `self_bleu_reference`."""
    if len(texts) < 2:
        return None

    bleu = BLEU(effective_order=True)
    score: dict[str, float] = {}
    for i, t in enumerate(texts):
        if t not in score:
            score[t] = bleu.sentence_score(t, [*texts[:i], *texts[i + 1 :]]).score / 100.0
    return float(np.mean([score[t] for t in texts]))


def self_bleu_reference(texts: Sequence[str]) -> float | None:
    """`self_bleu` computed plainly: one `sentence_score` per text (slow; the tests' reference)."""
    if len(texts) < 2:
        return None

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


# The format score `evaluate` scores with: any value in (0, 1) tells well-formed from malformed.
_FORMAT_PROBE = 0.5


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


class _TokenStats:
    """Token entropy and KL to a reference (`llm.eval.token_stats.token_entropy_kl`) summed per
    problem over the rollouts of one evaluation, one backend call at a time."""

    def __init__(
        self,
        problems: int,
        *,
        temperature: float,
        top_k: int,
        top_p: float,
        reference: torch.nn.Module | None,
    ) -> None:
        self.sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        self.reference = reference
        self.entropy = np.zeros(problems)  # summed over generated tokens, nats
        self.kl = np.zeros(problems)
        self.tokens = np.zeros(problems)

    def add(self, policy: torch.nn.Module, first: int, roll: Any) -> None:
        """`roll`'s responses (B prompts from problem `first` on), sampled from `policy`."""
        entropy, kl = token_entropy_kl(
            policy, roll.prompt_ids, roll.prompt_mask, roll.response_ids, roll.response_mask,
            reference=self.reference, **self.sampling,
        )  # fmt: skip
        rows = slice(first, first + entropy.shape[0])
        self.entropy[rows] += entropy.double().sum((1, 2)).numpy()
        if kl is not None:
            self.kl[rows] += kl.double().sum((1, 2)).numpy()
        self.tokens[rows] += roll.response_mask.double().sum((1, 2)).numpy()

    def per_problem(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(P,) mean token entropy and KL (None without a reference) per problem."""
        tokens = np.maximum(self.tokens, 1.0)
        return self.entropy / tokens, self.kl / tokens if self.reference is not None else None


def _with_token_stats(result: dict[str, Any], stats: _TokenStats | None) -> dict[str, Any]:
    """`result` with ``token_entropy`` and ``kl_to_reference`` (means over problems; None when
    not measured), and per problem when measured."""
    entropy, kl = stats.per_problem() if stats is not None else (None, None)
    for name, values in (("token_entropy", entropy), ("kl_to_reference", kl)):
        result[name] = float(values.mean()) if values is not None else None
        if values is not None:
            for record, v in zip(result["per_problem"], values, strict=True):
                record[name] = float(v)
    return result


def evaluate(
    backend: Any,
    task: Task | str,
    problems: Sequence[Problem],
    *,
    template: str,
    samples: int = 16,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    prompts_per_batch: int = 8,
    max_responses_per_call: int = 4096,
    distinct: str = "commutative",
    bleu: bool = True,
    encoder: Any | None = None,
    token_entropy: bool = False,
    reference: torch.nn.Module | None = None,
    policy: torch.nn.Module | None = None,
) -> dict[str, Any]:
    """Sample `samples` responses per problem of `task` through `backend` (a `RolloutBackend`) and
    measure them.

    A response is correct when ``task.score`` gives 1.0 and well-formed when it scores above 0
    with a positive format score; answers are the same when their ``task.answer_key`` (under
    `distinct`) is.

    Args:
        backend: ``generate(prompts, n, ...) -> RolloutBatch`` with ``texts`` (P, n); its
            ``tokenizer``, if any, is checked against the prompts (`llm.data.check_vocabulary`).
        task: a registered `Task` or its name.
        problems: (P,) problems of `task`.
        template: one of ``task.templates``.
        prompts_per_batch: prompts per backend call, at most.
        max_responses_per_call: responses per backend call, at most (prompts x samples; a group
            larger than this is sampled in several calls), so the engine's outputs stay bounded.
        bleu: compute Self-BLEU (the slowest metric on long responses).
        token_entropy: also measure the sampler's token entropy (a teacher-forced forward of
            `policy` over the sampled responses after each backend call; the samples are the same
            bytes as without it).
        reference: the base model: also measure the exact per-token KL of `policy` to it (implies
            `token_entropy`; the same tokenizer).
        policy: the evaluated model for those forwards (default: ``backend.model``).

    Returns:
        A JSON-ready dict: ``n`` (= `samples`), ``n_problems``, ``pass_at_k`` ({str(k): float},
        unbiased), ``maj_at_k`` ({str(k): float}, the same k), ``accuracy``, ``format_rate``,
        ``distinct_correct`` (distinct answer keys among correct responses, mean over problems),
        ``distinct_answers`` (distinct answer keys among all responses), ``answer_entropy``
        (nats) and ``effective_answers`` (mean of its exponential), ``distinct_n``
        ({"1".."4"}), ``self_bleu`` (None with ``bleu=False``), ``semantic_cosine_correct``
        (None without an encoder or correct pairs), ``token_entropy`` and ``kl_to_reference``
        (nats per generated token, mean over problems; None when not asked), ``per_problem``
        (``task.describe`` fields, ``correct``, ``distinct_correct``, ``distinct_answers``,
        ``answer_entropy``, and ``token_entropy`` / ``kl_to_reference`` when measured);
        ``solution_coverage`` and per-problem ``solutions`` when the task counts its solutions;
        ``format_rate`` again under ``task.format_key`` when set (math: ``boxed_rate``).

    Raises:
        ValueError: no problems, `samples < 1`, `prompts_per_batch < 1`,
            `max_responses_per_call < 1`, a template `task` does not have, a number the backend's tokenizer cannot encode,
            token measures without a `policy` (nor ``backend.model``), or a reference of another
            vocabulary size.
        UnknownTaskError: `task` names no registered task.
    """
    if (token_entropy or reference is not None) and policy is None:
        policy = getattr(backend, "model", None)
        if policy is None:
            raise ValueError("token_entropy: expected a policy model (the backend has no .model)")
    gen = torch.Generator().manual_seed(seed)
    sampling = Sampling(max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                        want_logprobs=False)  # fmt: skip

    def draw(prompts: list[str], n: int) -> list[Any]:
        return [backend.generate(prompts, n, sampling=sampling, generator=gen)]

    return _evaluate(
        draw, [policy], task, problems, template=template,
        tokenizer=getattr(backend, "tokenizer", None), samples=samples, sampling=sampling,
        prompts_per_batch=prompts_per_batch, max_responses_per_call=max_responses_per_call,
        distinct=distinct, bleu=bleu, encoder=encoder, token_entropy=token_entropy,
        reference=reference,
    )[0]  # fmt: skip


def measure(
    task: Task,
    problems: Sequence[Problem],
    texts: Sequence[Sequence[str]],
    *,
    samples: int,
    distinct: str = "commutative",
    bleu: bool = True,
    encoder: Any | None = None,
) -> dict[str, Any]:
    """`evaluate`'s record of sampled `texts` (P, samples), one group per problem (its Returns, but
    ``token_entropy`` and ``kl_to_reference``, which need the model)."""
    shared = _SharedMetrics(samples, bleu=bleu, encoder=encoder)
    per_problem, formats = [], []
    majk = np.zeros(len(shared.ks))
    for prob, group in zip(problems, texts, strict=True):
        scores = [task.score(t, prob, format_score=_FORMAT_PROBE) for t in group]
        keys = [task.answer_key(t, distinct=distinct) for t in group]
        correct = [t for t, s in zip(group, scores, strict=True) if s >= 1.0]
        correct_keys = {k for k, s in zip(keys, scores, strict=True) if s >= 1.0 and k is not None}
        c = shared.add(group, correct)
        formats.append(np.mean([s > 0 for s in scores]))
        majk += maj_at_k(*answer_counts(keys, [s >= 1.0 for s in scores]), shared.ks)
        record = {
            **task.describe(prob),
            "correct": c,
            "distinct_correct": len(correct_keys),
            "distinct_answers": len({k for k in keys if k is not None}),
            "answer_entropy": answer_entropy(keys),
        }
        if task.solution_count is not None:
            record["solutions"] = task.solution_count(prob, distinct)
        per_problem.append(record)
    result = {
        **shared.result(),
        "accuracy": float(np.mean([p["correct"] / samples for p in per_problem])),
        "format_rate": float(np.mean(formats)),
        "distinct_correct": float(np.mean([p["distinct_correct"] for p in per_problem])),
        "distinct_answers": float(np.mean([p["distinct_answers"] for p in per_problem])),
        "maj_at_k": {
            str(k): float(v / len(per_problem)) for k, v in zip(shared.ks, majk, strict=True)
        },
        "answer_entropy": float(np.mean([p["answer_entropy"] for p in per_problem])),
        "effective_answers": float(np.mean([math.exp(p["answer_entropy"]) for p in per_problem])),
        "per_problem": per_problem,
    }
    if task.format_key is not None:
        result[task.format_key] = result["format_rate"]
    if task.solution_count is not None:
        counted = [p for p in per_problem if p["solutions"]]
        result["solution_coverage"] = (
            float(np.mean([p["distinct_correct"] / p["solutions"] for p in counted]))
            if counted
            else 0.0
        )
    return result


def evaluate_models(
    models: Sequence[torch.nn.Module],
    tokenizer: Any,
    task: Task | str,
    problems: Sequence[Problem],
    *,
    template: str,
    stop_token_ids: Sequence[int],
    samples: int = 16,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    prompts_per_batch: int = 8,
    distinct: str = "commutative",
    bleu: bool = True,
    encoder: Any | None = None,
    token_entropy: bool = False,
    reference: torch.nn.Module | None = None,
) -> list[dict[str, Any]]:
    """`evaluate` of M models of one architecture at once: every call samples the same prompts for
    all models in one stacked program (`llm.rollout.stacked.sample_groups`), model m drawing from
    its own generator seeded with `seed` (paired: every model gets the same random stream). Each
    model's records are its records evaluated alone, to the bit (`llm.rollout.stacked.VERSION` 2: a
    generator draws only while its model's rows decode). Returns one `evaluate` record per model, in
    order. The models may sample in float32 or bfloat16, on the CPU or a GPU (their device; the
    generators are made there): each prompt runs once and its keys and values serve its samples,
    from a cache of fixed size (`llm.model.stacked`), the sampler of ``eval.sampler = "stacked"``.

    The stream differs from `evaluate` through `HFGenerateBackend` (transformers' `generate`
    draws from the global RNG), so the two give different samples of the same distribution.
    `token_entropy` and `reference` as `evaluate` (each model's forward over its own samples).

    Raises:
        ValueError: as `evaluate`; models `llm.model.stacked.StackedLM` cannot stack.
    """
    lm = StackedLM(models)
    generators = [torch.Generator(device=lm.device).manual_seed(seed) for _ in models]
    sampling = Sampling(max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                        want_logprobs=False)  # fmt: skip

    def draw(prompts: list[str], n: int) -> list[Any]:
        return sample_groups(lm, tokenizer, [prompts] * len(models), n, sampling,
                             generators=generators, stop_token_ids=stop_token_ids)  # fmt: skip

    return _evaluate(
        draw, models, task, problems, template=template, tokenizer=tokenizer, samples=samples,
        sampling=sampling, prompts_per_batch=prompts_per_batch,
        # one call per chunk of prompts: every model's group in one stacked program
        max_responses_per_call=samples * max(prompts_per_batch, 1), distinct=distinct,
        bleu=bleu, encoder=encoder, token_entropy=token_entropy, reference=reference,
    )  # fmt: skip


def _evaluate(
    draw: Callable[[list[str], int], Sequence[Any]],
    policies: Sequence[torch.nn.Module | None],
    task: Task | str,
    problems: Sequence[Problem],
    *,
    template: str,
    tokenizer: Any,
    samples: int,
    sampling: Sampling,
    prompts_per_batch: int,
    max_responses_per_call: int,
    distinct: str,
    bleu: bool,
    encoder: Any | None,
    token_entropy: bool,
    reference: torch.nn.Module | None,
) -> list[dict[str, Any]]:
    """The evaluation of M models (`evaluate`'s Returns, one record per model): the prompts
    checked against `tokenizer` (if any), `samples` texts per prompt of each model from
    ``draw(prompts, n) -> M RolloutBatches`` (`_sample_texts`), with each model's token measures
    (a forward of ``policies[m]`` over its samples) when asked, then `measure`.

    Raises:
        ValueError: as `evaluate`.
    """
    task = _task_with(task, template)
    prompts = [task.prompt(p, template) for p in problems]
    if tokenizer is not None:
        check_vocabulary(prompts, tokenizer, f"evaluation problems (task {task.name!r})")
    stats = None
    if token_entropy or reference is not None:
        stats = [
            _TokenStats(len(prompts), temperature=sampling.temperature, top_k=sampling.top_k,
                        top_p=sampling.top_p, reference=reference)
            for _ in policies
        ]  # fmt: skip

    def on_batch(first: int, rolls: Sequence[Any]) -> None:
        for m, roll in enumerate(rolls):
            stats[m].add(policies[m], first, roll)

    texts = _sample_texts(
        draw, prompts, models=len(policies), samples=samples,
        prompts_per_batch=prompts_per_batch, max_responses_per_call=max_responses_per_call,
        on_batch=None if stats is None else on_batch,
    )  # fmt: skip
    return [
        _with_token_stats(
            measure(
                task, problems, t, samples=samples, distinct=distinct, bleu=bleu, encoder=encoder
            ),
            None if stats is None else stats[m],
        )
        for m, t in enumerate(texts)
    ]


def _task_with(task: Task | str, template: str) -> Task:
    """The registered task (by name or itself), checked to have `template`.

    Raises:
        ValueError: a template the task does not have. UnknownTaskError: an unknown name.
    """
    task = TASKS[task] if isinstance(task, str) else task
    if template not in task.templates:
        raise ValueError(
            f"template: expected one of {task.templates} (task {task.name!r}), got {template!r}"
        )
    return task


def _sample_texts(
    draw: Callable[[list[str], int], Sequence[Any]],
    prompts: Sequence[str],
    *,
    models: int = 1,
    samples: int,
    prompts_per_batch: int,
    max_responses_per_call: int = 4096,
    on_batch: Callable[[int, Sequence[Any]], None] | None = None,
) -> list[list[list[str]]]:
    """`samples` sampled texts per prompt of each of `models` models (M, P, samples), from
    ``draw(chunk, n)`` (one `RolloutBatch` per model, texts only), in calls of at most
    `prompts_per_batch` prompts and `max_responses_per_call` responses (at least one prompt; a
    larger group in several calls of at most `max_responses_per_call` responses each).
    `on_batch(first, rolls)`, if given, sees each call's batches and the index of its first
    prompt (token measures, `_TokenStats`).

    Raises:
        ValueError: no prompts, `samples < 1`, `prompts_per_batch < 1` or
            `max_responses_per_call < 1`.
    """
    if not prompts:
        raise ValueError("problems: expected at least one problem")
    if samples < 1:
        raise ValueError(f"samples: expected >= 1, got {samples}")
    if prompts_per_batch < 1 or max_responses_per_call < 1:
        raise ValueError(
            "prompts_per_batch and max_responses_per_call: expected >= 1, got "
            f"{prompts_per_batch} and {max_responses_per_call}"
        )
    per_call = max(1, min(prompts_per_batch, max_responses_per_call // samples))
    groups = [
        min(max_responses_per_call, samples - s) for s in range(0, samples, max_responses_per_call)
    ]
    texts: list[list[list[str]]] = [[] for _ in range(models)]
    for start in range(0, len(prompts), per_call):
        chunk = list(prompts[start : start + per_call])
        chunk_texts = [[[] for _ in chunk] for _ in range(models)]
        for group in groups:
            rolls = draw(chunk, group)
            if on_batch is not None:
                on_batch(start, rolls)
            for mine, roll in zip(chunk_texts, rolls, strict=True):
                for texts_of, new in zip(mine, roll.texts, strict=True):
                    texts_of.extend(new)
        for mine, new in zip(texts, chunk_texts, strict=True):
            mine.extend(new)
    return texts
