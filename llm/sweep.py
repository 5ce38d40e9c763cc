"""Sweeps of shaping methods on an LLM task: ``python -m llm sweep --config FILE``.

A sweep TOML (``configs/sweep_countdown_tiny.toml``) names

- ``base``: the train config every run starts from (a path relative to the sweep file), and
  ``[train]``: overrides of it for every run (``steps``, ``lr``, ...);
- ``[[methods]]``: one entry per curve, each with a ``label`` (default: its ``method``), a
  ``method`` of `shaping.METHODS`, ``fixed`` values and a ``grid`` of values (``mode = "product"``,
  the default, or ``"zip"``: the lists taken side by side) or an explicit list ``points`` of
  settings. A key is a hyper-parameter of the method (``gamma_p``), a top-level train-config key
  (``lr``, ``kl_coef``) or a dotted one (``hyper.eta``, ``data.n_problems``);
- ``reference``: the label whose models form the reference curve (GRPO's: its checkpoints along
  training, plus its ``kl_coef`` / lr settings);
- ``seeds``: the training seeds (one run per method setting and seed);
- ``checkpoints``: the steps at which every run is evaluated (a list, or a count ``c``: steps
  ``round(i steps / c)``, i = 1..c), so that each run is a path; the base model is step 0 of all;
- ``[eval]``: ``problems`` (the first N of the base config's [eval] source, or of its set
  ``set``), ``samples`` n, ``ks``, the sampling ``seed`` and ``semantic`` (also the MiniLM
  cosine among correct answers; needs the dsdr extra). Every model is evaluated on the same
  problems with the same sampling seed, so comparisons are paired (`experiment.frontier`).

The runs go to worker processes (default one per core, one torch thread each; see
`llm.reproduce` for why one thread). ``OUT/runs/<run>/`` holds each run; ``sweep_run.json`` there
records the base model's weights hash, whether training finished, and each checkpoint's
evaluation with its settings. A rerun reuses a finished run whose resolved config and base
weights match, resumes an unfinished one from its newest checkpoint, retrains a stale one, and
reuses every evaluation whose settings match. Evaluated intermediate checkpoints are deleted once
the run is finished and evaluated (only the last, with its optimizer state, is kept); an
evaluation asked later of a deleted checkpoint retrains the run.

Writes ``OUT/results.json``: per model (label, method, parameters, seed, step) pass@k for every
k (the unbiased estimator of Chen et al. 2021 from the per-problem correct counts), pass@1,
accuracy, distinct correct solutions, and the per-problem correct and distinct-correct counts
(the bootstrap resamples problems from them); under ``frontier``, each model's lift at matched
pass@1 over the reference's upper envelope with a paired bootstrap CI over seeds and problems
(`experiment.frontier.bootstrap_lift`), for pass@k at the largest k and for distinct correct. Also
``OUT/frontier.png`` (`plot_frontier`) and ``OUT/lifts.md`` (`lift_markdown`).
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import dataclasses
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import re
import shutil
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import numerics
from experiment.store import read_json, write_json

__all__ = [
    "MEASURES",
    "RUN_MARKER",
    "Setting",
    "SweepSpec",
    "apply_sets",
    "default_workers",
    "format_results",
    "frontier_analysis",
    "frontier_arrays",
    "lift_markdown",
    "load_sweep",
    "map_jobs",
    "plot_frontier",
    "run_name",
    "run_sweep",
    "setting_name",
    "sweep_from_dict",
    "weights_sha",
]

RUN_MARKER = "sweep_run.json"
BASE_EVAL = "base_eval.json"
RESULTS = "results.json"

_TOP_KEYS = {
    "base", "train", "methods", "reference", "seeds", "checkpoints", "eval",
}  # fmt: skip
_METHOD_KEYS = {"label", "method", "fixed", "grid", "mode", "points"}
_EVAL_KEYS = {"problems", "samples", "ks", "seed", "set", "semantic"}
# Set per run by the sweep itself: a grid over them would break the paths or the pairing.
_RESERVED = {"method", "seed", "steps", "save_every", "model_path", "build_base_model", "eval"}


# ---------------------------------------------------------------------------------------------
# Small shared helpers (also used by `llm.reproduce`)


def weights_sha(folder: str | os.PathLike[str]) -> str:
    """sha256 over a model folder's ``*.safetensors`` files (identifies the weights).

    Raises:
        FileNotFoundError: the folder holds no ``*.safetensors`` file.
    """
    h = hashlib.sha256()
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def default_workers() -> int:
    """One worker per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _quiet_worker() -> None:
    """One torch thread (see `llm.reproduce`) and no per-checkpoint loading bars."""
    import torch

    torch.set_num_threads(1)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def map_jobs(
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    *,
    workers: int,
    progress: bool,
    desc: str,
    name: Callable[[Any], str],
) -> list[Any]:
    """`fn` over `jobs` (results in job order) with a tqdm bar over finished jobs; inline when
    ``workers <= 1``, else in `workers` spawned processes."""
    from tqdm.auto import tqdm

    results: list[Any] = [None] * len(jobs)
    bar = tqdm(total=len(jobs), desc=desc, disable=not progress, unit="run")
    if workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            bar.set_postfix_str(name(job))
            results[i] = fn(job)
            bar.update(1)
    else:
        # spawn, not fork: a forked child inherits torch's thread pools and can deadlock.
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
            try:
                for fut in cf.as_completed(futures):
                    i = futures[fut]
                    results[i] = fut.result()
                    bar.set_postfix_str(name(jobs[i]))
                    bar.update(1)
            except BaseException:
                # Fail fast: without this the pool's exit would run every queued job first.
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    bar.close()
    return results


# ---------------------------------------------------------------------------------------------
# The sweep file


@dataclass
class Setting:
    """One point of a method's grid: its label, method and parameter values."""

    label: str
    method: str
    params: dict[str, Any]


@dataclass
class SweepSpec:
    """A parsed, validated sweep (see the module docstring for the keys)."""

    base: str
    """path of the base train config"""
    train: dict[str, Any]
    """overrides of the base config for every run"""
    settings: list[Setting]
    """the method settings, in file order"""
    reference: str
    """label of the reference curve"""
    seeds: list[int]
    checkpoints: list[int]
    """steps at which every run is evaluated (ascending; the last is the run's steps)"""
    steps: int
    eval: dict[str, Any] = field(default_factory=dict)
    """problems, samples, ks, seed, set"""
    source: str = ""
    """the sweep file (for the record)"""

    @property
    def labels(self) -> list[str]:
        """The method labels, in file order, each once."""
        return list(dict.fromkeys(s.label for s in self.settings))


def apply_sets(doc: Mapping[str, Any], sets: Iterable[str]) -> dict[str, Any]:
    """A copy of the parsed sweep `doc` with each ``KEY=VALUE`` applied, e.g. ``seeds=[0]``,
    ``train.steps=20``, ``eval.problems=8``. KEY's first part must be a sweep key; VALUE is TOML.

    Raises:
        ValueError: a pair without ``=`` or with an unknown key (the message names it).
    """
    from experiment.schema import parse_value

    out = copy.deepcopy(dict(doc))
    for pair in sets:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {pair!r}: expected KEY=VALUE (e.g. train.steps=20)")
        *tables, name = key.split(".")
        if (tables[0] if tables else name) not in _TOP_KEYS:
            raise ValueError(
                f"--set {pair!r}: unknown sweep key {key!r}; known: {sorted(_TOP_KEYS)}"
            )
        target = out
        for t in tables:
            target = target.setdefault(t, {})
            if not isinstance(target, dict):
                raise ValueError(f"--set {pair!r}: {t} is not a table")
        target[name] = parse_value(text.strip())
    return out


def _grid_points(entry: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    grid = entry.get("grid", {})
    points = entry.get("points")
    mode = entry.get("mode", "product")
    if not isinstance(grid, dict):
        raise ValueError(f"{where}.grid: expected a table of lists, got {grid!r}")
    if points is not None:
        if grid:
            raise ValueError(f"{where}: give either grid or points, not both")
        if (
            not isinstance(points, list)
            or not points
            or not all(isinstance(p, dict) for p in points)
        ):
            raise ValueError(f"{where}.points: expected a non-empty list of tables, got {points!r}")
        return [dict(p) for p in points]
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ValueError(f"{where}.grid.{k}: expected a non-empty list, got {v!r}")
    if mode not in ("product", "zip"):
        raise ValueError(f"{where}.mode: expected 'product' or 'zip', got {mode!r}")
    keys = list(grid)
    if mode == "zip":
        sizes = {k: len(grid[k]) for k in keys}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"{where}.grid: mode 'zip' needs lists of one length, got {sizes}")
        combos = list(zip(*(grid[k] for k in keys), strict=True)) if keys else [()]
    else:
        combos = list(itertools.product(*(grid[k] for k in keys)))
    return [dict(zip(keys, c, strict=True)) for c in combos]


def _checkpoints(value: Any, steps: int) -> list[int]:
    if isinstance(value, bool):
        raise ValueError(f"checkpoints: expected a count or a list of steps, got {value!r}")
    if isinstance(value, int):
        if not 1 <= value <= steps:
            raise ValueError(f"checkpoints: expected a count in [1, steps = {steps}], got {value}")
        return sorted({round(i * steps / value) for i in range(1, value + 1)})
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"checkpoints: expected a count or a list of steps, got {value!r}")
    steps_list = sorted(set(value))
    if steps_list[0] < 1 or steps_list[-1] != steps:
        raise ValueError(
            f"checkpoints: expected steps in [1, {steps}] ending at steps = {steps}, got {value!r}"
        )
    return steps_list


def _split_params(method: str, params: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The raw-config updates of one setting: hyper-parameters of `method` go to [hyper],
    train-config keys (plain or dotted) to their place."""
    import shaping
    from llm.config import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    hyper_names = set(shaping.METHODS[method].defaults)
    raw: dict[str, Any] = {}
    for key, value in params.items():
        head = key.split(".")[0]
        if head in _RESERVED:
            raise ValueError(
                f"{where}.{key}: set by the sweep itself (see seeds, checkpoints, eval)"
            )
        if "." in key:
            if head not in fields:
                raise ValueError(f"{where}.{key}: unknown config table {head!r}")
            *tables, name = key.split(".")
            target = raw
            for t in tables:
                target = target.setdefault(t, {})
            target[name] = value
        elif key in fields:
            raw[key] = value
        elif key in hyper_names:
            raw.setdefault("hyper", {})[key] = value
        else:
            raise ValueError(
                f"{where}.{key}: neither a hyper-parameter of {method!r} "
                f"({sorted(hyper_names)}) nor a train-config key"
            )
    return raw


def _merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def sweep_from_dict(doc: Mapping[str, Any], *, root: str | os.PathLike[str] = ".") -> SweepSpec:
    """A validated `SweepSpec` from a parsed sweep TOML; `root` resolves a relative ``base``.

    Every run's train config is built and validated here, so a bad value fails before any run.

    Raises:
        ValueError: an unknown or missing key, or an invalid value (the message names the key).
        FileNotFoundError: the base config does not exist.
    """
    import shaping
    from llm.config import config_from_dict

    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"unknown sweep key(s) {unknown}; known: {sorted(_TOP_KEYS)}")
    for key in ("base", "methods", "seeds", "checkpoints"):
        if key not in doc:
            raise ValueError(f"{key}: missing (required sweep key)")
    base = Path(doc["base"])
    if not base.is_absolute():
        base = Path(root) / base
    if not base.is_file():
        raise FileNotFoundError(f"base: no such train config {str(base)!r}")
    train = doc.get("train", {})
    if not isinstance(train, dict):
        raise ValueError(f"train: expected a table of config overrides, got {train!r}")
    try:
        base_raw = _merge(_read_toml(base), train)
        base_cfg = config_from_dict(base_raw)
    except ValueError as e:
        raise ValueError(f"train: {e}") from None

    seeds = doc["seeds"]
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ValueError(f"seeds: expected a list of distinct integers >= 0, got {seeds!r}")
    checkpoints = _checkpoints(doc["checkpoints"], base_cfg.steps)

    ev = doc.get("eval", {})
    if not isinstance(ev, dict):
        raise ValueError(f"eval: expected a table, got {ev!r}")
    bad = sorted(set(ev) - _EVAL_KEYS)
    if bad:
        raise ValueError(f"eval: unknown key(s) {bad}; known: {sorted(_EVAL_KEYS)}")
    evald = {
        "problems": ev.get("problems", base_cfg.eval.n_problems),
        "samples": ev.get("samples", base_cfg.eval.n_samples),
        "seed": ev.get("seed", 0),
        "set": ev.get("set"),
        "semantic": ev.get("semantic", False),
    }
    if not isinstance(evald["semantic"], bool):
        raise ValueError(f"eval.semantic: expected true or false, got {evald['semantic']!r}")
    for key in ("problems", "samples"):
        v = evald[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"eval.{key}: expected an integer >= 1, got {v!r}")
    if not isinstance(evald["seed"], int) or isinstance(evald["seed"], bool):
        raise ValueError(f"eval.seed: expected an integer, got {evald['seed']!r}")
    from llm.eval.heldout import k_values

    ks = ev.get("ks", k_values(evald["samples"]))
    if (
        not isinstance(ks, list)
        or not ks
        or not all(isinstance(k, int) and not isinstance(k, bool) for k in ks)
        or not all(1 <= k <= evald["samples"] for k in ks)
    ):
        raise ValueError(
            f"eval.ks: expected a list of k in [1, samples = {evald['samples']}], got {ks!r}"
        )
    evald["ks"] = sorted({1, *ks})  # pass@1 is the frontier's x axis

    methods = doc["methods"]
    if not isinstance(methods, list) or not methods:
        raise ValueError(f"methods: expected a non-empty array of tables, got {methods!r}")
    settings: list[Setting] = []
    seen: set[tuple[str, str]] = set()
    for i, entry in enumerate(methods):
        where = f"methods[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a table, got {entry!r}")
        bad = sorted(set(entry) - _METHOD_KEYS)
        if bad:
            raise ValueError(f"{where}: unknown key(s) {bad}; known: {sorted(_METHOD_KEYS)}")
        method = entry.get("method")
        if method not in shaping.METHODS:
            raise ValueError(
                f"{where}.method: expected one of {sorted(shaping.METHODS)}, got {method!r}"
            )
        label = entry.get("label", method)
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9_.+-]+", label):
            raise ValueError(f"{where}.label: expected letters, digits, _ . + -, got {label!r}")
        where = f"methods[{label}]"
        fixed = entry.get("fixed", {})
        if not isinstance(fixed, dict):
            raise ValueError(f"{where}.fixed: expected a table, got {fixed!r}")
        for point in _grid_points(entry, where):
            params = {**fixed, **point}
            key = (label, json.dumps(params, sort_keys=True))
            if key in seen:
                raise ValueError(f"{where}: the setting {params} appears twice")
            seen.add(key)
            setting = Setting(label, method, params)
            run_raw = _run_raw(base_raw, setting, seeds[0], checkpoints, where)
            try:
                config_from_dict(run_raw)
            except ValueError as e:
                raise ValueError(f"{where} {params}: {e}") from None
            settings.append(setting)
    reference = doc.get("reference", settings[0].label)
    if reference not in {s.label for s in settings}:
        raise ValueError(
            f"reference: expected one of the labels {sorted({s.label for s in settings})}, "
            f"got {reference!r}"
        )
    return SweepSpec(
        base=str(base),
        train=dict(train),
        settings=settings,
        reference=reference,
        seeds=list(seeds),
        checkpoints=checkpoints,
        steps=base_cfg.steps,
        eval=evald,
    )


def _read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    with Path(path).open("rb") as f:
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: invalid TOML: {e}") from None


def load_sweep(path: str | os.PathLike[str], sets: Iterable[str] = ()) -> SweepSpec:
    """Read a sweep TOML, apply ``--set`` pairs (`apply_sets`) and validate it (`sweep_from_dict`).

    Raises:
        ValueError: invalid TOML or an invalid sweep (the message names the key).
        FileNotFoundError: no such file, or no such base config.
    """
    doc = apply_sets(_read_toml(path), sets)
    spec = sweep_from_dict(doc, root=Path(path).resolve().parent)
    spec.source = str(path)
    return spec


def _run_raw(
    base_raw: dict[str, Any],
    setting: Setting,
    seed: int,
    checkpoints: list[int],
    where: str | None = None,
) -> dict[str, Any]:
    """The raw train config of one run: the base's [hyper] only when the method is the base's,
    the setting's values, one thread, a checkpoint at every evaluated step."""
    out = copy.deepcopy(base_raw)
    if out.get("method") != setting.method:
        out.pop("hyper", None)
    out = _merge(out, _split_params(setting.method, setting.params, where or setting.label))
    out["method"] = setting.method
    out["seed"] = seed
    out["num_threads"] = 1
    out["build_base_model"] = False
    out["save_every"] = math.gcd(*checkpoints)
    out["tensorboard"] = False
    return out


def _base_raw(spec: SweepSpec) -> dict[str, Any]:
    return _merge(_read_toml(spec.base), spec.train)


def run_name(setting: Setting, seed: int) -> str:
    """Folder name of one run: ``<label>[_<key>=<value>...]_seed<s>``."""
    parts = [setting.label, *(f"{k}={v}" for k, v in setting.params.items()), f"seed{seed}"]
    return re.sub(r"[^A-Za-z0-9_.=+-]", "-", "_".join(parts))


# ---------------------------------------------------------------------------------------------
# Jobs: train a run (or reuse it) and evaluate its checkpoints


@dataclass
class _Job:
    name: str
    setting: Setting | None  # None: the base model
    seed: int
    raw: dict[str, Any]
    out: str
    base_sha: str
    steps: list[int]
    problems: list[Any]
    eval_key: dict[str, Any]
    progress: bool


def _evaluate_model(cfg: Any, model_path: Path, problems: list[Any], ev: Mapping[str, Any]) -> dict:
    """One model's evaluation record on the paired problems: per-problem correct counts and
    distinct correct solutions, accuracy, Self-BLEU (pass@k follows from the counts,
    `_with_passk`)."""
    from llm.eval.heldout import evaluate
    from llm.model.load import load_model_and_tokenizer
    from llm.rollout.backend import make_backend

    model, tokenizer = load_model_and_tokenizer(model_path, "cpu")
    backend = make_backend(cfg, model, tokenizer)
    n = ev["samples"]
    common = {
        "n": n,
        "template": cfg.template,
        "max_new_tokens": cfg.eval.max_new_tokens or cfg.max_new_tokens,
        "temperature": cfg.eval.temperature,
        "top_p": cfg.eval.top_p,
        "top_k": cfg.eval.top_k,
        "seed": ev["seed"],
    }
    if ev["semantic"]:
        from llm.eval.diversity import load_encoder

        common["encoder"] = load_encoder("cpu")
    start = time.perf_counter()
    r = evaluate(backend, cfg.task, problems, distinct=cfg.distinct, **common)
    distinct = [p["distinct_correct"] for p in r["per_problem"]]
    correct = [int(p["correct"]) for p in r["per_problem"]]
    return {
        "accuracy": float(np.mean(correct) / n),
        "distinct_correct": float(np.mean(distinct)),
        "self_bleu": r.get("self_bleu"),
        "semantic_cosine_correct": r.get("semantic_cosine_correct"),
        "n": n,
        "correct": correct,
        "distinct": [int(d) for d in distinct],
        "eval_seconds": round(time.perf_counter() - start, 2),
    }


def _with_passk(record: Mapping[str, Any], ks: Sequence[int]) -> dict[str, Any]:
    """`record` with ``pass_at_k`` (unbiased estimator of Chen et al. 2021,
    `theory.measures.pass_at_k`, averaged over problems) for every k of `ks`, and ``pass1``."""
    from theory.measures import pass_at_k

    n, correct = record["n"], record["correct"]
    passk = {str(k): float(np.mean([pass_at_k(n, c, k) for c in correct])) for k in ks}
    return {"pass_at_k": passk, "pass1": passk["1"], **record}


def _eval_base(job: _Job) -> dict[str, Any]:
    from llm.config import config_from_dict

    _quiet_worker()
    cfg = config_from_dict(job.raw)
    path = Path(job.out) / BASE_EVAL
    key = {**job.eval_key, "weights_sha256": job.base_sha}
    cached = read_json(path)
    if cached is not None and cached.get("eval") == key:
        return {"models": {0: cached["result"]}, "reused_run": False, "reused_evals": 1}
    result = _evaluate_model(cfg, Path(cfg.model_path), job.problems, job.eval_key)
    write_json(path, {"eval": key, "result": result})
    return {"models": {0: result}, "reused_run": False, "reused_evals": 0}


def _checkpoint_dir(out: Path, step: int) -> Path:
    from llm.run.checkpoint import CHECKPOINTS

    return out / CHECKPOINTS / f"step_{step:06d}"


def _train(job: _Job, cfg: Any) -> tuple[dict[str, Any], bool]:
    """Train `job`'s run unless a finished matching one exists (`llm.reproduce`'s resume rule);
    returns (its marker, whether it was reused)."""
    from llm.config import config_from_dict, config_to_toml
    from llm.run.checkpoint import latest_checkpoint
    from llm.run.folder import read_metrics
    from llm.train.trainer import train

    out = Path(job.out)
    marker_path = out / RUN_MARKER
    marker = read_json(marker_path)
    saved = out / "config.toml"
    same = (
        marker is not None
        and marker.get("base_sha") == job.base_sha
        and marker.get("numerics") == numerics.tag()
        and saved.is_file()
        and config_to_toml(config_from_dict(_read_toml(saved))) == config_to_toml(cfg)
    )
    ckpt = latest_checkpoint(out) if same else None
    if (
        same
        and marker.get("finished")
        and ckpt is not None
        and ckpt.name == f"step_{cfg.steps:06d}"
    ):
        return marker, True
    if out.exists() and (not same or ckpt is None):
        # A run of another config or base model (its checkpoints are not this run's), or one
        # killed before its first checkpoint: a fresh start needs an empty folder.
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    prior = float(marker.get("train_seconds", 0.0)) if same and marker else 0.0
    evals = marker.get("evals", {}) if same and marker else {}
    marker = {
        "base_sha": job.base_sha,
        "numerics": numerics.tag(),
        "finished": False,
        "train_seconds": prior,
        "evals": evals,
    }
    write_json(marker_path, marker)
    start = time.perf_counter()
    train(cfg, out, resume=ckpt is not None, progress=job.progress)
    marker["train_seconds"] = round(prior + time.perf_counter() - start, 1)
    rewards = [m["charts/reward_mean"] for m in read_metrics(out / "metrics.jsonl")]
    tail = max(1, len(rewards) // 10)
    marker["train_reward_first"] = float(np.mean(rewards[:tail]))
    marker["train_reward_last"] = float(np.mean(rewards[-tail:]))
    marker["finished"] = True
    write_json(marker_path, marker)
    return marker, False


def _run_job(job: _Job) -> dict[str, Any]:
    """Train (or reuse) one run and evaluate (or reuse) each of its checkpoints; runs in a
    worker process. Returns ``{"models": {step: record}, "reused_run", "reused_evals",
    "train_seconds"}``."""
    from llm.config import config_from_dict

    if job.setting is None:
        return _eval_base(job)
    _quiet_worker()
    cfg = config_from_dict(job.raw)
    out = Path(job.out)
    marker, reused = _train(job, cfg)

    def missing(m: dict[str, Any]) -> list[int]:
        ev = m.get("evals", {})
        return [s for s in job.steps if ev.get(str(s), {}).get("eval") != job.eval_key]

    if any(not _checkpoint_dir(out, s).is_dir() for s in missing(marker)):
        # An evaluation asked of a checkpoint deleted after an earlier evaluation: train again.
        shutil.rmtree(out)
        marker, reused = _train(job, cfg)
    todo = missing(marker)
    _quiet_worker()  # train() set the config's thread count; evaluation uses one thread too
    for step in todo:
        path = _checkpoint_dir(out, step)
        result = _evaluate_model(cfg, path, job.problems, job.eval_key)
        result["weights_sha256"] = weights_sha(path)
        marker["evals"][str(step)] = {"eval": job.eval_key, "result": result}
        write_json(out / RUN_MARKER, marker)
    _prune(out, cfg.steps)
    return {
        "models": {s: marker["evals"][str(s)]["result"] for s in job.steps},
        "reused_run": reused,
        "reused_evals": len(job.steps) - len(todo),
        "train_seconds": marker.get("train_seconds"),
        "train_reward_first": marker.get("train_reward_first"),
        "train_reward_last": marker.get("train_reward_last"),
    }


def _prune(out: Path, last: int) -> None:
    """Keep only the last checkpoint of a finished, evaluated run (it holds the optimizer state
    a longer rerun resumes from)."""
    from llm.run.checkpoint import CHECKPOINTS

    keep = _checkpoint_dir(out, last)
    for p in (out / CHECKPOINTS).glob("*"):
        if p != keep and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The driver


def _eval_problems(spec: SweepSpec, base_cfg: Any) -> tuple[list[Any], str]:
    """The paired evaluation problems: the first ``eval.problems`` of the base config's [eval]
    source (set ``eval.set`` when it names several)."""
    from llm.config import config_from_dict
    from llm.data import load_eval_sets

    raw = _base_raw(spec)
    raw.setdefault("eval", {})["n_problems"] = spec.eval["problems"]
    sets = load_eval_sets(config_from_dict(raw))
    name = spec.eval["set"] or next(iter(sets))
    if name not in sets:
        raise ValueError(f"eval.set: expected one of {sorted(sets)}, got {name!r}")
    problems = sets[name][: spec.eval["problems"]]
    if len(problems) < spec.eval["problems"]:
        raise ValueError(
            f"eval.problems: {spec.eval['problems']} asked, the set {name!r} has {len(problems)}"
        )
    return problems, f"{base_cfg.eval.source}:{name}"


def _problem_dict(p: Any) -> dict[str, Any]:
    d = dataclasses.asdict(p) if dataclasses.is_dataclass(p) else {"problem": str(p)}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def run_sweep(
    spec: SweepSpec,
    out: str | os.PathLike[str],
    *,
    workers: int | None = None,
    progress: bool = True,
    num_resamples: int = 1000,
) -> dict[str, Any]:
    """Train and evaluate every (setting, seed) of `spec` into `out` and write ``results.json``.

    Returns:
        The results mapping (see the module docstring): ``settings``, ``problems``, ``models``
        (one record per label, parameters, seed and step; step 0 is the base model, listed once
        with label ``base``), ``runs``, ``reused`` and ``timings_seconds``.

    Raises:
        ValueError: invalid evaluation settings (e.g. more problems than the set holds).
    """
    from llm.config import config_from_dict

    t_start = time.perf_counter()
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    workers = default_workers() if workers is None else workers
    base_raw = _base_raw(spec)
    base_cfg = config_from_dict(base_raw)
    if base_cfg.build_base_model:
        from llm.model.tiny import ensure_base_model

        # Here, once: workers building it side by side would race on the folder.
        ensure_base_model(base_cfg.model_path, num_threads=max(1, workers), progress=progress)
    base_sha = weights_sha(base_cfg.model_path)
    problems, source = _eval_problems(spec, base_cfg)
    # ks is not part of it: pass@k for any k follows from the stored correct counts.
    eval_key = {
        **{k: v for k, v in spec.eval.items() if k != "ks"},
        "source": source,
        "problems_sha256": hashlib.sha256(
            json.dumps([_problem_dict(p) for p in problems], sort_keys=True).encode()
        ).hexdigest(),
        "temperature": base_cfg.eval.temperature,
        "top_p": base_cfg.eval.top_p,
        "top_k": base_cfg.eval.top_k,
        "max_new_tokens": base_cfg.eval.max_new_tokens or base_cfg.max_new_tokens,
        "template": base_cfg.template,
        "distinct": base_cfg.distinct,
        "numerics": numerics.tag(),  # an evaluation under other numeric settings is not reused
    }
    base_setting = Setting("base", base_cfg.method, {})
    jobs = [
        _Job("base", None, 0, _run_raw(base_raw, base_setting, 0, spec.checkpoints),
             str(out), base_sha, [0], problems, eval_key, False)
    ]  # fmt: skip
    for setting in spec.settings:
        for seed in spec.seeds:
            name = run_name(setting, seed)
            jobs.append(
                _Job(name, setting, seed, _run_raw(base_raw, setting, seed, spec.checkpoints),
                     str(out / "runs" / name), base_sha, spec.checkpoints, problems, eval_key,
                     progress and workers <= 1)
            )  # fmt: skip
    t0 = time.perf_counter()
    outcomes = map_jobs(
        _run_job, jobs, workers=workers, progress=progress, desc="runs (train + eval)",
        name=lambda j: j.name,
    )  # fmt: skip
    t_runs = time.perf_counter() - t0

    ks = spec.eval["ks"]
    base = _with_passk(outcomes[0]["models"][0], ks)
    models = [{"label": "base", "method": None, "params": {}, "seed": None, "step": 0,
               "run": None, **base}]  # fmt: skip
    runs = []
    for job, res in zip(jobs[1:], outcomes[1:], strict=True):
        assert job.setting is not None
        s = job.setting
        runs.append(
            {"run": job.name, "label": s.label, "method": s.method, "params": s.params,
             "seed": job.seed, "train_seconds": res["train_seconds"], "reused": res["reused_run"],
             "train_reward_first": res["train_reward_first"],
             "train_reward_last": res["train_reward_last"]}
        )  # fmt: skip
        for step in job.steps:
            models.append(
                {"label": s.label, "method": s.method, "params": s.params, "seed": job.seed,
                 "step": step, "run": job.name, **_with_passk(res["models"][step], ks)}
            )  # fmt: skip
    results: dict[str, Any] = {
        "settings": {
            "sweep": spec.source,
            "base": spec.base,
            "train": spec.train,
            "model_path": str(base_cfg.model_path),
            "base_weights_sha256": base_sha,
            "steps": spec.steps,
            "lr": base_cfg.lr,
            "group_size": base_cfg.group_size,
            "prompts_per_step": base_cfg.prompts_per_step,
            "checkpoints": spec.checkpoints,
            "seeds": spec.seeds,
            "reference": spec.reference,
            "labels": spec.labels,
            "settings": [dataclasses.asdict(s) for s in spec.settings],
            "eval": {**eval_key, "ks": ks},
            "workers": workers,
        },
        "problems": [_problem_dict(p) for p in problems],
        "models": models,
        "runs": runs,
        "reused": {
            "runs": sum(1 for r in outcomes[1:] if r["reused_run"]),
            "of": len(jobs) - 1,
            "evals": sum(r["reused_evals"] for r in outcomes),
            "evals_of": sum(len(j.steps) for j in jobs),
        },
        "timings_seconds": {
            "runs": round(t_runs, 1),
            "total": round(time.perf_counter() - t_start, 1),
        },
    }
    t0 = time.perf_counter()
    results["frontier"] = frontier_analysis(results, num_resamples=num_resamples)
    plot_frontier(results, results["frontier"], out / "frontier.png")
    (out / "lifts.md").write_text(lift_markdown(results, results["frontier"]), encoding="utf-8")
    results["timings_seconds"]["frontier"] = round(time.perf_counter() - t0, 1)
    results["timings_seconds"]["total"] = round(time.perf_counter() - t_start, 1)
    write_json(out / RESULTS, results)
    return results


# ---------------------------------------------------------------------------------------------
# Frontier: lifts at matched pass@1 over the reference curve (experiment.frontier), figure, table

MEASURES = ("pass_at_k", "distinct_correct")
"""The diversity axes: pass@k at the largest k, and distinct correct solutions per problem."""


def setting_name(params: Mapping[str, Any]) -> str:
    """``"k=v,k=v"`` (``"default"`` for no parameters): a model's setting label."""
    return ",".join(f"{k}={v}" for k, v in params.items()) or "default"


def frontier_arrays(
    results: Mapping[str, Any], measure: str
) -> tuple[np.ndarray, np.ndarray, Any, list[dict[str, Any]]]:
    """The per-problem gains over the base model in `experiment.frontier`'s layout.

    Models are (label, setting, step); the base model is the reference label's step 0 (every
    training path starts there), repeated over seeds.

    Returns:
        ``(x, y, models, rows)``: `x` `(M, S, P)` per-problem pass@1 gain (correct count / n minus
        the base's), `y` `(M, S, P)` the per-problem gain in `measure` (pass@k at the largest k,
        unbiased estimator, or distinct correct solutions), `models` a `experiment.frontier.Models`,
        `rows` one ``{"label", "params", "setting", "step"}`` per model.

    Raises:
        ValueError: an unknown `measure`, or a model missing some seed.
    """
    from experiment.frontier import Models
    from theory.measures import pass_at_k

    if measure not in MEASURES:
        raise ValueError(f"measure: expected one of {MEASURES}, got {measure!r}")
    s = results["settings"]
    seeds, kmax = s["seeds"], int(s["eval"]["ks"][-1])

    def per_problem(m: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        c = np.asarray(m["correct"], dtype=np.float64)
        if measure == "pass_at_k":
            y = np.array([pass_at_k(m["n"], int(ci), kmax) for ci in c])
        else:
            y = np.asarray(m["distinct"], dtype=np.float64)
        return c / m["n"], y

    base = next(m for m in results["models"] if m["label"] == "base")
    bx, by = per_problem(base)
    groups: dict[tuple[str, str, int], dict[int, Mapping[str, Any]]] = {}
    rows = [{"label": s["reference"], "params": {}, "setting": "base", "step": 0}]
    for m in results["models"]:
        if m["label"] == "base":
            continue
        key = (m["label"], setting_name(m["params"]), m["step"])
        if key not in groups:
            groups[key] = {}
            rows.append(
                {"label": m["label"], "params": m["params"], "setting": key[1], "step": m["step"]}
            )
        groups[key][m["seed"]] = m
    shape = (len(rows), len(seeds), len(bx))
    x, y = np.zeros(shape), np.zeros(shape)
    for i, row in enumerate(rows[1:], start=1):
        per_seed = groups[(row["label"], row["setting"], row["step"])]
        for j, seed in enumerate(seeds):
            if seed not in per_seed:
                raise ValueError(
                    f"{row['label']} {row['setting']} step {row['step']}: no seed {seed}"
                )
            px, py = per_problem(per_seed[seed])
            x[i, j], y[i, j] = px - bx, py - by
    models = Models(
        [r["label"] for r in rows], [r["setting"] for r in rows], [r["step"] for r in rows]
    )
    return x, y, models, rows


def frontier_analysis(
    results: Mapping[str, Any], *, num_resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """Lift at matched pass@1 of every model over the reference label's upper envelope, with a
    paired bootstrap over training seeds and problems (`experiment.frontier.bootstrap_lift`), and a
    bootstrap interval of every model's point, for each measure of `MEASURES`.

    Returns:
        ``{measure: {"k", "level", "num_resamples", "models": [{label, params, setting, step,
        x, y, x_lo, x_hi, y_lo, y_hi, lift, lift_lo, lift_hi, status, inside_fraction}]}}``,
        gains over the base model (x: pass@1, y: the measure), NaN written as null.
    """
    from experiment.frontier import (
        bootstrap_indices,
        bootstrap_lift,
        percentile_interval,
        resampled_points,
    )

    s = results["settings"]
    one_seed = len(s["seeds"]) == 1
    out: dict[str, Any] = {}
    for measure in MEASURES:
        x, y, models, rows = frontier_arrays(results, measure)
        res = bootstrap_lift(
            x, y, models, s["reference"], num_resamples=num_resamples, level=level, seed=seed,
            resample_seeds=not one_seed,
        )  # fmt: skip
        seed_idx, problem_idx = bootstrap_indices(
            np.random.default_rng(seed), num_resamples, x.shape[1], x.shape[2]
        )
        bx, by = resampled_points(x, y, seed_idx, problem_idx)
        x_lo, x_hi = percentile_interval(bx, level)
        y_lo, y_hi = percentile_interval(by, level)

        def num(v: float) -> float | None:
            return float(v) if np.isfinite(v) else None

        out[measure] = {
            "k": int(s["eval"]["ks"][-1]) if measure == "pass_at_k" else None,
            "level": level,
            "num_resamples": num_resamples,
            "models": [
                {
                    **row,
                    "x": num(res.x[i]),
                    "y": num(res.y[i]),
                    "x_lo": num(x_lo[i]),
                    "x_hi": num(x_hi[i]),
                    "y_lo": num(y_lo[i]),
                    "y_hi": num(y_hi[i]),
                    "lift": num(res.lift[i]),
                    "lift_lo": num(res.lo[i]),
                    "lift_hi": num(res.hi[i]),
                    "status": str(res.status[i]),
                    "inside_fraction": float(res.inside_fraction[i]),
                    "reference": bool(i in set(res.reference.tolist())),
                }
                for i, row in enumerate(rows)
            ],
        }
    return out


def _axis_label(measure: str, k: int | None) -> str:
    return f"pass@{k} gain" if measure == "pass_at_k" else "distinct correct / problem gain"


def lift_markdown(results: Mapping[str, Any], analysis: Mapping[str, Any]) -> str:
    """Markdown tables of the lifts at matched pass@1 with their bootstrap CIs (points in
    percentage points for pass@k, solutions per problem for distinct correct)."""
    s = results["settings"]
    ev = s["eval"]
    parts = [
        f"Lift at matched pass@1 over the upper envelope of `{s['reference']}` (all its settings "
        "and checkpoints, and the base model at step 0), gains over the base model. "
        f"Paired evaluation: {ev['problems']} problems ({ev['source']}) × {ev['samples']} "
        "samples, "
        f"sampling seed {ev['seed']} for every model; training seeds {s['seeds']}; "
        "CI: percentile bootstrap over seeds and problems. n/a: the model's pass@1 lies outside "
        "the reference's range (no extrapolation); inside: fraction of bootstrap replicates "
        "inside it."
    ]
    for measure, a in analysis.items():
        scale = 100.0 if measure == "pass_at_k" else 1.0
        unit = "percentage points" if measure == "pass_at_k" else "solutions per problem"
        pct = round(100 * a["level"])
        parts.append(
            f"\n### {_axis_label(measure, a['k'])} ({unit}; pass@1 in percentage points)\n"
        )
        parts.append(
            f"| method | setting | step | pass@1 gain | gain | lift [{pct}% CI] | inside |\n"
            "|---|---|---|---|---|---|---|"
        )
        for m in a["models"]:
            if m["reference"]:
                continue
            if m["status"] == "inside" and m["lift"] is not None:
                cell = f"{scale * m['lift']:+.2f}"
                if m["lift_lo"] is not None:
                    cell += f" [{scale * m['lift_lo']:+.2f}, {scale * m['lift_hi']:+.2f}]"
            else:
                cell = f"n/a ({m['status']})"
            parts.append(
                f"| {m['label']} | {m['setting']} | {m['step']} | {100 * m['x']:+.1f} | "
                f"{scale * m['y']:+.2f} | {cell} | {m['inside_fraction']:.2f} |"
            )
    return "\n".join(parts) + "\n"


def plot_frontier(
    results: Mapping[str, Any], analysis: Mapping[str, Any], path: str | os.PathLike[str]
) -> None:
    """The frontier figure: per measure, every model's point (gain over the base model) on its
    training path (thin line from the base model through its checkpoints), each label's upper
    envelope (`experiment.frontier.upper_envelope`) in its colour with the bootstrap
    CIs of its vertices, and the reference's envelope in black."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiment.frontier import upper_envelope

    s = results["settings"]
    ref = s["reference"]
    labels = [ref, *(lb for lb in s["labels"] if lb != ref)]
    colours = {lb: ("k" if lb == ref else f"C{i}") for i, lb in enumerate(labels)}
    fig, axes = plt.subplots(1, len(analysis), figsize=(5.2 * len(analysis), 4.2), squeeze=False)
    for ax, (measure, a) in zip(axes[0], analysis.items(), strict=True):
        ms = a["models"]
        for lb in labels:
            pts = [m for m in ms if m["label"] == lb]
            px = np.array([m["x"] for m in pts])
            py = np.array([m["y"] for m in pts])
            c = colours[lb]
            ax.scatter(px, py, s=10, color=c, alpha=0.35, lw=0)
            for setting in dict.fromkeys(m["setting"] for m in pts if m["step"] > 0):
                trail = sorted((m for m in pts if m["setting"] == setting), key=lambda m: m["step"])
                # Every training path starts at the base model, the origin of the gains.
                ax.plot([0.0, *(m["x"] for m in trail)], [0.0, *(m["y"] for m in trail)], "-",
                        color=c, alpha=0.25, lw=0.7)  # fmt: skip
            env = upper_envelope(px, py)
            # E is flat left of its first vertex down to the smallest pass@1 of the set.
            ax.plot([env.x_min, *env.vx], [env.vy[0], *env.vy], "-", color=c,
                    lw=2.5 if lb == ref else 1.5,
                    label=f"{lb} (reference)" if lb == ref else lb)  # fmt: skip
            vert = [
                m
                for m in pts
                if any(m["x"] == vx and m["y"] == vy for vx, vy in zip(env.vx, env.vy, strict=True))
            ]
            ax.errorbar(
                [m["x"] for m in vert], [m["y"] for m in vert],
                xerr=[[m["x"] - m["x_lo"] for m in vert], [m["x_hi"] - m["x"] for m in vert]],
                yerr=[[m["y"] - m["y_lo"] for m in vert], [m["y_hi"] - m["y"] for m in vert]],
                fmt="o", ms=3, color=c, capsize=2, lw=0.8,
            )  # fmt: skip
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlabel("pass@1 gain over the base model")
        ax.set_ylabel(_axis_label(measure, a["k"]))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    ev = s["eval"]
    fig.suptitle(
        f"frontiers: {ev['problems']} problems × {ev['samples']} samples (paired), seeds "
        f"{s['seeds']}, checkpoints {s['checkpoints']}; bars: {round(100 * a['level'])}% "
        "bootstrap CIs of the envelope vertices",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def format_results(results: Mapping[str, Any]) -> str:
    """A one-line-per-setting text summary (last checkpoint, mean over seeds) for the terminal."""
    s = results["settings"]
    last = s["checkpoints"][-1]
    kmax = str(s["eval"]["ks"][-1])
    rows: dict[str, list[dict[str, Any]]] = {}
    for m in results["models"]:
        if m["step"] in (0, last):
            key = m["label"] + (f" {m['params']}" if m["params"] else "")
            rows.setdefault(key, []).append(m)
    lines = [f"{'model':48s} pass@1  pass@{kmax:<4s} distinct correct"]
    for key, ms in rows.items():
        p1 = np.mean([m["pass1"] for m in ms])
        pk = np.mean([m["pass_at_k"][kmax] for m in ms])
        dc = np.mean([m["distinct_correct"] for m in ms])
        lines.append(f"{key[:48]:48s} {p1:.3f}  {pk:.3f}     {dc:.2f}")
    r = results["reused"]
    lines.append(
        f"reused {r['runs']} of {r['of']} runs and {r['evals']} of {r['evals_of']} evaluations; "
        f"{results['timings_seconds']['total']:.0f} s"
    )
    return "\n".join(lines)
