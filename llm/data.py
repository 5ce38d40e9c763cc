"""The problems of a config's task, through the task registry (`llm.tasks.TASKS`).

The trainer and `llm eval` look the task up by ``cfg.task``; this module only turns the config's
``[data]`` and ``[eval]`` tables into problem lists and checks prompts against a tokenizer.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from llm.config import TrainConfig
from llm.model.tiny import TinyConfig, tiny_problems
from llm.model.tokens import check_vocabulary
from llm.tasks import TASKS, Problem

__all__ = [
    "Problem",
    "check_data_file",
    "check_data_files",
    "check_vocabulary",
    "data_indices",
    "drop_long_prompts",
    "load_eval_sets",
    "load_train_problems",
    "tiny_config",
]

# A whitespace-delimited run of digits: a number the prompt states as its own word.


def _where(cfg: TrainConfig, table: str, path: str = "") -> str:
    if path:
        return path
    source = getattr(cfg, table).source
    return f"[{table}] source = {source!r} (task {cfg.task!r})"


def check_data_file(path: str | os.PathLike[str], key: str = "data.path") -> None:
    """Refuse a data path that is missing or a folder, naming `key` and the path.

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: a folder, not a data file.
    """
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(
            f"{key}: {str(p)!r} is a folder; expected a .jsonl or .parquet file"
        )
    if not p.exists():
        raise FileNotFoundError(f"{key}: {str(p)!r} does not exist")


def check_data_files(cfg: TrainConfig) -> None:
    """Refuse the config's data files that are missing or folders (`check_data_file`):
    ``data.path`` with ``data.source = "file"``, each of ``eval.paths`` with ``eval.source =
    "file"``; a run checks them at its launch, before it builds a base model or writes anything.

    Raises:
        FileNotFoundError, IsADirectoryError: naming the key and the path.
    """
    if cfg.data.source == "file":
        check_data_file(cfg.data.path)
    if cfg.eval.source == "file":
        for path in cfg.eval.paths:
            check_data_file(path, "eval.paths")


def _from_file(cfg: TrainConfig, path: str) -> list[Problem]:
    check_data_file(path)
    problems = TASKS[cfg.task].load(path)
    if not problems:
        raise ValueError(f"{path}: holds no problems")
    return problems


def load_train_problems(cfg: TrainConfig, tokenizer: Any = None) -> list[Problem]:
    """The training problems of ``cfg.data``: llm.model.tiny's train stream (tasks with ``tiny_data``),
    a local file (``TASKS[cfg.task].load``), or generated with ``data.seed``
    (``TASKS[cfg.task].generate``). With a `tokenizer`, their prompts in ``cfg.template`` are
    checked by `check_vocabulary`.

    Raises:
        ValueError: an empty or malformed file (the loaders name the file, row and field); a
            number the tokenizer cannot encode (`check_vocabulary`).
        FileNotFoundError: ``data.path`` does not exist.
    """
    d = cfg.data
    task = TASKS[cfg.task]
    if d.source == "tiny":
        problems = tiny_problems(tiny_config(cfg), "train", d.n_problems)
    elif d.source == "file":
        problems = _from_file(cfg, d.path)
    else:
        problems = task.generate(d.n_problems, d.seed, d)
    if tokenizer is not None:
        prompts = [task.prompt(p, cfg.template) for p in problems]
        check_vocabulary(
            prompts, tokenizer, _where(cfg, "data", d.path if d.source == "file" else "")
        )
    return problems


def tiny_config(cfg: TrainConfig) -> TinyConfig:
    """The `llm.model.tiny.TinyConfig` of `cfg`: the package's default, with ``cfg.tiny_data_seed``
    as its ``data_seed`` and ``cfg.tiny_sum_fraction`` / ``cfg.tiny_rule_fraction`` as its
    designed regime's shares (the problem streams of the ``tiny`` sources and the base model
    `build_base_model` builds)."""
    return TinyConfig(
        data_seed=cfg.tiny_data_seed,
        sum_fraction=cfg.tiny_sum_fraction,
        rule_fraction=cfg.tiny_rule_fraction,
    )


def load_eval_sets(cfg: TrainConfig) -> dict[str, list[Problem]]:
    """Held-out problems of ``cfg.eval`` by set name: ``{"heldout": [...]}`` for the tiny and
    generated sources, ``{file stem: [...]}`` per file of ``eval.paths`` (each cut to
    ``eval.n_problems``)."""
    e = cfg.eval
    if e.source == "tiny":
        return {"heldout": tiny_problems(tiny_config(cfg), "heldout", e.n_problems)}
    if e.source == "generate":
        return {"heldout": TASKS[cfg.task].generate(e.n_problems, e.seed, cfg.data)}
    return {Path(p).stem: _from_file(cfg, p)[: e.n_problems] for p in e.paths}


def data_indices(position: int, count: int, n: int, seed: int) -> list[int]:
    """Problem indices for prompts ``position .. position + count - 1`` of the data stream.

    The stream is a fresh permutation of ``range(n)`` per data epoch, drawn from
    ``np.random.default_rng((seed, epoch))``, so any position is reproducible without state.
    """
    out = []
    for p in range(position, position + count):
        epoch, offset = divmod(p, n)
        out.append(int(_permutation(n, seed, epoch)[offset]))
    return out


_PERM_CACHE: dict[tuple[int, int, int], np.ndarray] = {}


def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    key = (n, seed, epoch)
    if key not in _PERM_CACHE:
        _PERM_CACHE.clear()  # only the current epoch is ever needed again
        _PERM_CACHE[key] = np.random.default_rng((seed, epoch)).permutation(n)
    return _PERM_CACHE[key]


def drop_long_prompts(problems: list[Problem], cfg: TrainConfig, tokenizer: Any) -> list[Problem]:
    """The problems whose prompt fits in ``max_prompt_tokens`` (verl's filter_overlong_prompts).

    Raises:
        ValueError: none fits.
    """
    prompts = [TASKS[cfg.task].prompt(p, cfg.template) for p in problems]
    lengths = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
    kept = [p for p, n in zip(problems, lengths, strict=True) if n <= cfg.rollout.max_prompt_tokens]
    if not kept:
        raise ValueError(
            f"max_prompt_tokens: every prompt is longer than {cfg.rollout.max_prompt_tokens} tokens "
            f"(shortest {min(lengths)})"
        )
    if len(kept) < len(problems):
        warnings.warn(
            f"max_prompt_tokens: dropped {len(problems) - len(kept)} of {len(problems)} "
            f"problems whose prompt is longer than {cfg.rollout.max_prompt_tokens} tokens",
            stacklevel=2,
        )
    return kept
