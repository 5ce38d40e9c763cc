"""Sweeps of shaping methods on an LLM task: ``python -m llm sweep --config FILE``.

A sweep TOML (``configs/sweep_countdown_tiny.toml``) names

- ``base``: the train config every run starts from (a path relative to the sweep file), and
  ``[train]``: overrides of it for every run (``steps``, ``lr``, ...);
- ``[[methods]]``, ``seeds``, ``checkpoints`` and ``reference``: the sweep grammar both drivers
  share (`experiment.spec`: ``method``, ``label``, ``fixed``, ``grid``, ``zip`` or ``points``). A
  key of a setting is a hyper-parameter of the method (``gamma_p``), a top-level train-config key
  (``lr``, ``kl_coef``) or a dotted one (``hyper.eta``, ``data.n_problems``). The reference
  labels' models form the reference curve (GRPO's: its checkpoints along training, plus its
  ``kl_coef`` / lr settings); one run per method setting and seed; every run is evaluated at the
  ``checkpoints``, so that each run is a path; the base model is step 0 of all;
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
``OUT/frontier.png`` and ``OUT/lifts.md`` (`write_reports`, `experiment.report`).
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import dataclasses
import hashlib
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
import torch
from tqdm.auto import tqdm
from transformers.utils import logging as hf_logging

import numerics
import shaping
from experiment import frontier, report
from experiment.spec import (
    COMMON_KEYS,
    apply_sets,
    parse_checkpoints,
    parse_methods,
    parse_reference,
    parse_seeds,
)
from experiment.store import read_json, write_json
from llm.config import TrainConfig, config_from_dict, config_to_toml
from llm.data import load_eval_sets
from llm.eval.diversity import load_encoder
from llm.eval.heldout import evaluate, k_values
from llm.model.load import load_model_and_tokenizer
from llm.model.tiny import ensure_base_model
from llm.rollout.backend import make_backend
from llm.run.checkpoint import CHECKPOINTS, latest_checkpoint
from llm.run.folder import read_metrics
from llm.train.trainer import train
from theory.measures import pass_at_k

__all__ = [
    "RUN_MARKER",
    "Setting",
    "SweepSpec",
    "default_workers",
    "format_results",
    "frontier_analysis",
    "frontier_arrays",
    "lift_intro",
    "load_sweep",
    "map_jobs",
    "run_name",
    "run_sweep",
    "setting_name",
    "sweep_from_dict",
    "weights_sha",
    "write_reports",
]

RUN_MARKER = "sweep_run.json"
BASE_EVAL = "base_eval.json"
RESULTS = "results.json"

_TOP_KEYS = {*COMMON_KEYS, "base", "train", "eval"}
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
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()


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
    reference: list[str]
    """labels of the reference curve"""
    seeds: list[int]
    checkpoints: list[int]
    """steps at which every run is evaluated (ascending; the last is the run's steps)"""
    steps: int
    eval: dict[str, Any] = field(default_factory=dict)
    """problems, samples, ks, seed, set"""
    source: str = ""
    """the sweep file (for the record)"""
    doc: dict[str, Any] = field(default_factory=dict)
    """the parsed sweep document (for the record: results.json's ``config``)"""

    @property
    def labels(self) -> list[str]:
        """The method labels, in file order, each once."""
        return list(dict.fromkeys(s.label for s in self.settings))


def _split_params(method: str, params: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The raw-config updates of one setting: hyper-parameters of `method` go to [hyper],
    train-config keys (plain or dotted) to their place."""

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


def _check_key(method: str, key: str, where: str) -> None:
    """Whether a setting of `method` may hold `key` (`_split_params`'s rules; raises ValueError)."""
    _split_params(method, {key: None}, where)


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

    seeds = list(parse_seeds(doc["seeds"]))
    checkpoints = list(parse_checkpoints(doc["checkpoints"], base_cfg.steps))

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

    entries = parse_methods(doc["methods"], _check_key)
    settings: list[Setting] = []
    for entry in entries:
        where = f"methods[{entry.label}]"
        for point in entry.points:
            params = {**entry.fixed, **point}
            setting = Setting(entry.label, entry.method, params)
            run_raw = _run_raw(base_raw, setting, seeds[0], checkpoints, where)
            try:
                config_from_dict(run_raw)
            except ValueError as e:
                raise ValueError(f"{where} {params}: {e}") from None
            settings.append(setting)
    reference = list(parse_reference(doc.get("reference"), entries))
    return SweepSpec(
        base=str(base),
        train=dict(train),
        settings=settings,
        reference=reference,
        seeds=list(seeds),
        checkpoints=checkpoints,
        steps=base_cfg.steps,
        eval=evald,
        doc=copy.deepcopy(dict(doc)),
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
    doc = apply_sets(_read_toml(path), sets, _TOP_KEYS)
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

    n, correct = record["n"], record["correct"]
    passk = {str(k): float(np.mean([pass_at_k(n, c, k) for c in correct])) for k in ks}
    return {"pass_at_k": passk, "pass1": passk["1"], **record}


def _eval_base(job: _Job) -> dict[str, Any]:

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

    return out / CHECKPOINTS / f"step_{step:06d}"


def _train(job: _Job, cfg: Any) -> tuple[dict[str, Any], bool]:
    """Train `job`'s run unless a finished matching one exists (`llm.reproduce`'s resume rule);
    returns (its marker, whether it was reused)."""

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

    keep = _checkpoint_dir(out, last)
    for p in (out / CHECKPOINTS).glob("*"):
        if p != keep and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The driver


def _eval_problems(spec: SweepSpec, base_cfg: Any) -> tuple[list[Any], str]:
    """The paired evaluation problems: the first ``eval.problems`` of the base config's [eval]
    source (set ``eval.set`` when it names several)."""

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

    t_start = time.perf_counter()
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    workers = default_workers() if workers is None else workers
    base_raw = _base_raw(spec)
    base_cfg = config_from_dict(base_raw)
    if base_cfg.build_base_model:
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
        **report.results_header(
            "llm",
            numerics_tag=numerics.tag(),
            config=spec.doc,
            methods={s.label: s.method for s in spec.settings},
            reference=spec.reference,
            seeds=spec.seeds,
            checkpoints=spec.checkpoints,
        ),
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
    write_reports(results, out / "frontier.png", out / "lifts.md")
    results["timings_seconds"]["frontier"] = round(time.perf_counter() - t0, 1)
    results["timings_seconds"]["total"] = round(time.perf_counter() - t_start, 1)
    write_json(out / RESULTS, results)
    return results


# ---------------------------------------------------------------------------------------------
# Frontier: lifts at matched pass@1 over the reference curve (experiment.frontier), figure, table


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

    if measure not in report.MEASURES:
        raise ValueError(f"measure: expected one of {report.MEASURES}, got {measure!r}")
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
    rows = [{"label": s["reference"][0], "params": {}, "setting": "base", "step": 0}]
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
    models = frontier.Models(
        [r["label"] for r in rows], [r["setting"] for r in rows], [r["step"] for r in rows]
    )
    return x, y, models, rows


def frontier_analysis(
    results: Mapping[str, Any], *, num_resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """Lift at matched pass@1 of every model over the reference labels' upper envelope, for each
    measure of `experiment.report.MEASURES` (`experiment.report.lift_analysis`: paired bootstrap
    over training seeds and problems, bootstrap intervals of every point).

    Returns:
        ``{measure: section}`` of `lift_analysis`; gains over the base model (x: pass@1, y: the
        measure), NaN written as null.
    """
    s = results["settings"]
    out: dict[str, Any] = {}
    for measure in report.MEASURES:
        x, y, models, rows = frontier_arrays(results, measure)
        k = int(s["eval"]["ks"][-1]) if measure == "pass_at_k" else None
        out[measure], _ = report.lift_analysis(
            x, y, models, rows, s["reference"], k=k, num_resamples=num_resamples, level=level,
            seed=seed,
        )  # fmt: skip
    return out


def lift_intro(results: Mapping[str, Any]) -> str:
    """The paragraph above the lift tables (`experiment.report.lift_markdown`): the reference,
    the paired evaluation design, the seeds and the CI."""
    s = results["settings"]
    ev = s["eval"]
    return (
        f"Lift at matched pass@1 over the upper envelope of `{', '.join(s['reference'])}` (all "
        "its settings and checkpoints, and the base model at step 0), gains over the base model. "
        f"Paired evaluation: {ev['problems']} problems ({ev['source']}) × {ev['samples']} "
        "samples, "
        f"sampling seed {ev['seed']} for every model; training seeds {s['seeds']}; "
        "CI: percentile bootstrap over seeds and problems. n/a: the model's pass@1 lies outside "
        "the reference's range (no extrapolation); inside: fraction of bootstrap replicates "
        "inside it."
    )


def write_reports(results: Mapping[str, Any], frontier_png: Path, lifts_md: Path) -> str:
    """Write the frontier figure and the lift tables (`experiment.report`); returns the tables."""
    s = results["settings"]
    ev = s["eval"]
    level = next(iter(results["frontier"].values()))["level"]
    report.plot_frontier(
        results["frontier"], frontier_png, labels=s["labels"], reference=s["reference"],
        title=f"frontiers: {ev['problems']} problems × {ev['samples']} samples (paired), seeds "
        f"{s['seeds']}, checkpoints {s['checkpoints']}; bars: {round(100 * level)}% "
        "bootstrap CIs of the envelope vertices",
    )  # fmt: skip
    text = report.lift_markdown(results["frontier"], lift_intro(results))
    lifts_md.write_text(text, encoding="utf-8")
    return text


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
