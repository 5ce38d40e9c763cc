"""The runs of an LLM sweep (`llm.orchestrate.sweep`): one `Job` trains a run, or reuses a finished
one whose resolved config, base weights and numeric settings match, resumes an unfinished one from
its newest checkpoint, evaluates each asked checkpoint on the paired problems (reusing evaluations
whose settings match), and prunes the evaluated intermediate checkpoints; `map_jobs`
(`llm.orchestrate.executor`) runs jobs in worker processes (spawned) or Ray tasks, one torch thread
each.

Files of a run folder: ``sweep_run.json`` (`RUN_MARKER`: the base weights' hash, whether training
finished, each checkpoint's evaluation with its settings); the base model's evaluation goes to
``OUT/base_eval.json`` (`BASE_EVAL`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.utils import logging as hf_logging

import numerics
from experiment.store import read_json, write_json
from llm.config import EVAL_PRECISION, EvalConfig, TrainConfig, config_to_toml, load_config
from llm.eval.diversity import load_encoder
from llm.eval.heldout import evaluate, evaluate_models
from llm.model.load import load_model_and_tokenizer
from llm.orchestrate.executor import map_jobs
from llm.rollout.backend import make_backend
from llm.rollout.base import stop_token_ids
from llm.rollout.stacked import VERSION as SAMPLER_VERSION
from llm.run.checkpoint import CHECKPOINTS, latest_checkpoint, upgrade_run_config
from llm.run.distributed import set_matmul_precision
from llm.run.folder import LOCK_FILE, RunLock, read_metrics
from llm.tasks import TASKS
from llm.train.batched import VERSION as BATCHED_VERSION
from llm.train.batched import train_batch
from llm.train.loop import USER_CODE, user_code
from llm.train.trainer import train
from theory.measures import pass_at_k

__all__ = [
    "BASE_EVAL",
    "RUN_MARKER",
    "Job",
    "collect",
    "default_workers",
    "eval_key",
    "evaluate_model",
    "map_jobs",
    "problem_dict",
    "run_batch",
    "run_job",
    "weights_sha",
    "with_passk",
]

RUN_MARKER = "sweep_run.json"
BASE_EVAL = "base_eval.json"


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
    """One torch thread (see `llm.orchestrate.reproduce`) and no per-checkpoint loading bars."""
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()


@dataclass
class Job:
    """One job of a sweep: a run to train (or reuse) and the checkpoints to evaluate."""

    name: str
    setting: Any  # the sweep's `Setting` of this run (None: the base model)
    seed: int
    cfg: TrainConfig
    """the run's train config (resolved once, `llm.orchestrate.sweep_spec.run_config`; the base
    model's evaluation: the base config)"""
    out: str
    base_sha: str
    steps: list[int]
    problems: list[Any]
    eval_key: dict[str, Any]
    progress: bool


def evaluate_model(cfg: Any, model_path: Path, problems: list[Any], ev: Mapping[str, Any]) -> dict:
    """One model's evaluation record on the paired problems: per-problem correct counts and
    distinct correct solutions, accuracy, Self-BLEU (pass@k follows from the counts,
    `with_passk`)."""

    device = cfg.system.device
    set_matmul_precision(device, cfg.system.tf32)
    if cfg.eval.sampler == "stacked":
        return _evaluate_stacked(cfg, [model_path], problems, ev)[0]
    model, tokenizer = load_model_and_tokenizer(model_path, device, EVAL_PRECISION[cfg.eval.dtype])
    backend = make_backend(cfg, model, tokenizer)
    samples = ev["samples"]
    common = {
        "samples": samples,
        "prompts_per_batch": cfg.eval.prompts_per_batch,
        "max_responses_per_call": cfg.eval.max_responses_per_call,
        "template": cfg.template,
        "max_new_tokens": cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
        "temperature": cfg.eval.temperature,
        "top_p": cfg.eval.top_p,
        "top_k": cfg.eval.top_k,
        "seed": ev["seed"],
    }
    if ev["semantic"]:
        common["encoder"] = load_encoder(device)
    start = time.perf_counter()
    r = evaluate(backend, cfg.task, problems, distinct=cfg.distinct, **common)
    seconds = time.perf_counter() - start
    del backend, model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the next run of this worker gets the memory back
    return _record(r, samples, seconds)


def _record(r: Mapping[str, Any], samples: int, seconds: float) -> dict[str, Any]:
    """A sweep's evaluation record of an `evaluate` result (``n``: the samples per problem)."""
    distinct = [p["distinct_correct"] for p in r["per_problem"]]
    correct = [int(p["correct"]) for p in r["per_problem"]]
    return {
        "accuracy": float(np.mean(correct) / samples),
        "distinct_correct": float(np.mean(distinct)),
        "self_bleu": r.get("self_bleu"),
        "semantic_cosine_correct": r.get("semantic_cosine_correct"),
        "maj_at_k": r.get("maj_at_k"),
        "answer_entropy": r.get("answer_entropy"),
        "n": samples,
        "correct": correct,
        "distinct": [int(d) for d in distinct],
        "eval_seconds": round(seconds, 2),
    }


def _eval_base(job: Job) -> dict[str, Any]:

    _quiet_worker()
    cfg = job.cfg
    path = Path(job.out) / BASE_EVAL
    key = {**job.eval_key, "weights_sha256": job.base_sha}
    cached = read_json(path)
    if cached is not None and same_eval(cached.get("eval"), key):
        return {"models": {0: cached["result"]}, "reused_run": False, "reused_evals": 1}
    if job.eval_key.get("engine") == "batched":
        result = _evaluate_stacked(cfg, [Path(cfg.model_path)], job.problems, job.eval_key)[0]
    else:
        result = evaluate_model(cfg, Path(cfg.model_path), job.problems, job.eval_key)
    write_json(path, {"eval": key, "result": result})
    return {"models": {0: result}, "reused_run": False, "reused_evals": 0}


def _checkpoint_dir(out: Path, step: int) -> Path:

    return out / CHECKPOINTS / f"step_{step:06d}"


def _same_numerics(recorded: Any, device: str) -> bool:
    """Whether a run recorded under the numeric settings `recorded` may be reused here. On the
    CPU they must be this process's (`numerics.tag()`). On another device the CPU's pinned
    kernels (MKL, oneDNN) take no part in the run's floats, and a GPU's bits are not reproducible
    anyway, so the pin alone does not void it (a change of pin version made the third GPU lease
    retrain 7 finished runs, CHANGELOG.md), but the package's own arithmetic does: a run recorded
    before `numerics.EXACT_CENTRING` is not reused by a process after it, nor the reverse
    (`numerics.same_arithmetic`; a tag that names no version is reused)."""
    if device == "cpu":
        return recorded == numerics.tag()
    return numerics.same_arithmetic(str(recorded)) is not False


def same_eval(recorded: Any, key: Mapping[str, Any]) -> bool:
    """Whether an evaluation recorded under the key `recorded` answers `key` (`eval_key`): equal
    keys, or, for an evaluation on another device than the CPU (the key names its ``device``),
    equal but for ``numerics`` (`_same_numerics`)."""
    if recorded == key:
        return True
    if not isinstance(recorded, dict) or "device" not in key:
        return False
    return {k: v for k, v in recorded.items() if k != "numerics"} == {
        k: v for k, v in key.items() if k != "numerics"
    }


def _prepare(job: Job, cfg: Any, engine: str) -> tuple[dict[str, Any], bool, bool]:
    """`job`'s marker before training: (marker, finished (reuse it), resume (from its newest
    checkpoint)). A finished run is reused when its last checkpoint is there or when every
    evaluation `job` asks for is recorded. A folder of another config, base model, numeric
    setting or engine, or of another version of a method or task defined outside the package
    (`llm.train.loop.user_code`: the user edited it), or one killed before its first checkpoint,
    is emptied
    (`llm.orchestrate.reproduce`'s resume rule). A saved config under removed spellings is
    upgraded first (`llm.run.checkpoint.upgrade_run_config`: the same resolved config, the moves
    recorded in the folder)."""
    out = Path(job.out)
    marker_path = out / RUN_MARKER
    marker = read_json(marker_path)
    saved = out / "config.toml"
    if marker is not None:
        # A folder saved under a key removed since (an earlier lease's eval.n_samples): its config
        # rewritten with the new keys, the moves recorded, before it is compared.
        upgrade_run_config(out)
    code = user_code(cfg)  # empty for the package's method and task
    same = (
        marker is not None
        and marker.get("base_sha") == job.base_sha
        and {k: marker.get(k) for k in USER_CODE} == {k: code.get(k) for k in USER_CODE}
        and _same_numerics(marker.get("numerics"), cfg.system.device)
        and marker.get("engine", "process") == engine
        and marker.get("batched_version") == (BATCHED_VERSION if engine == "batched" else None)
        and saved.is_file()
        and config_to_toml(load_config(saved)) == config_to_toml(cfg)
    )
    ckpt = latest_checkpoint(out) if same else None
    evaluated = same and all(
        same_eval(marker.get("evals", {}).get(str(s), {}).get("eval"), job.eval_key)
        for s in job.steps
    )
    if (
        same
        and marker.get("finished")
        # Its last checkpoint, or every asked evaluation (its checkpoints may have been deleted
        # for disk space, as bench/gpu/lease.py's pruner does on a GPU lease).
        and ((ckpt is not None and ckpt.name == f"step_{cfg.steps:06d}") or evaluated)
    ):
        return marker, True, False
    if out.exists() and (not same or ckpt is None):
        # A run of another config or base model (its checkpoints are not this run's), or one
        # killed before its first checkpoint: a fresh start needs an empty folder.
        _empty_run_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    prior = float(marker.get("train_seconds", 0.0)) if same and marker else 0.0
    evals = marker.get("evals", {}) if same and marker else {}
    marker = {
        "base_sha": job.base_sha,
        "numerics": numerics.tag(),
        "engine": engine,
        **({"batched_version": BATCHED_VERSION} if engine == "batched" else {}),
        **code,
        "finished": False,
        "train_seconds": prior,
        "evals": evals,
    }
    write_json(marker_path, marker)
    return marker, False, ckpt is not None


def _empty_run_folder(out: Path) -> None:
    """Empty the run folder `out` for a fresh start, under its lock: a folder that a live
    process holds (``llm train`` into it, another sweep's worker) is refused, never deleted.

    Raises:
        llm.run.folder.RunFolderError: a live process holds `out` (its PID named).
    """
    with RunLock(out):
        for p in out.iterdir():
            if p.name == LOCK_FILE:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


def _finish(job: Job, marker: dict[str, Any], seconds: float) -> None:
    """Record a trained run's time and training rewards in its marker."""
    out = Path(job.out)
    # Milliseconds: a tiny run trains in well under 0.1 s, and a 0 would read as "not measured".
    marker["train_seconds"] = round(float(marker.get("train_seconds", 0.0)) + seconds, 3)
    rewards = [m["charts/reward_mean"] for m in read_metrics(out / "metrics.jsonl")]
    tail = max(1, len(rewards) // 10)
    marker["train_reward_first"] = float(np.mean(rewards[:tail]))
    marker["train_reward_last"] = float(np.mean(rewards[-tail:]))
    marker["finished"] = True
    write_json(out / RUN_MARKER, marker)


def _train(job: Job, cfg: Any) -> tuple[dict[str, Any], bool]:
    """Train `job`'s run alone unless a finished matching one exists; returns (its marker,
    whether it was reused)."""
    marker, finished, resume = _prepare(job, cfg, "process")
    if finished:
        return marker, True
    start = time.perf_counter()
    train(cfg, Path(job.out), resume=resume, progress=job.progress)
    _finish(job, marker, time.perf_counter() - start)
    return marker, False


def run_job(job: Job) -> dict[str, Any]:
    """Train (or reuse) one run and evaluate (or reuse) each of its checkpoints; runs in a
    worker process. Returns ``{"models": {step: record}, "reused_run", "reused_evals",
    "train_seconds"}``."""

    if job.setting is None:
        return _eval_base(job)
    _quiet_worker()
    cfg = job.cfg
    out = Path(job.out)
    marker, reused = _train(job, cfg)

    def missing(m: dict[str, Any]) -> list[int]:
        ev = m.get("evals", {})
        return [s for s in job.steps if not same_eval(ev.get(str(s), {}).get("eval"), job.eval_key)]

    if _unevaluable(job, marker):
        # An evaluation asked of a checkpoint deleted after an earlier evaluation: train again.
        _empty_run_folder(out)
        marker, reused = _train(job, cfg)
    todo = missing(marker)
    _quiet_worker()  # train() set the config's thread count; evaluation uses one thread too
    for step in todo:
        path = _checkpoint_dir(out, step)
        result = evaluate_model(cfg, path, job.problems, job.eval_key)
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


def run_batch(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """`run_job` of several runs that may share a batch (`llm.train.batched.batch_key`): the
    runs that need training train together (`llm.train.batched.train_batch`, grouped by the step
    they resume from), then every missing evaluation of every run is sampled in one stacked
    program per chunk of prompts (`llm.eval.heldout.evaluate_models`). Markers record
    ``engine: batched``; a run trained by the other engine is trained again. Returns one
    `run_job` outcome per job, in order."""
    _quiet_worker()
    cfgs = [j.cfg for j in jobs]
    states = [_prepare(j, c, "batched") for j, c in zip(jobs, cfgs, strict=True)]
    for i, (job, (marker, finished, _)) in enumerate(zip(jobs, states, strict=True)):
        if finished and _unevaluable(job, marker):
            # An evaluation asked of a checkpoint deleted after an earlier evaluation (another
            # evaluation key, e.g. another sampler version): train the run again.
            _empty_run_folder(Path(job.out))
            states[i] = _prepare(job, cfgs[i], "batched")
    groups: dict[bool, list[int]] = {}
    for i, (_, finished, resume) in enumerate(states):
        if not finished:
            groups.setdefault(resume, []).append(i)
    for resume, members in groups.items():
        if resume:  # resumed runs may stand at different steps: one batch per step
            by_step: dict[str, list[int]] = {}
            for i in members:
                by_step.setdefault(latest_checkpoint(Path(jobs[i].out)).name, []).append(i)
            batches = list(by_step.values())
        else:
            batches = [members]
        for batch in batches:
            start = time.perf_counter()
            train_batch([cfgs[i] for i in batch], [jobs[i].out for i in batch], resume=resume)
            seconds = (time.perf_counter() - start) / len(batch)
            for i in batch:
                _finish(jobs[i], states[i][0], seconds)
    _quiet_worker()
    markers = [s[0] for s in states]
    todo = [
        (i, step)
        for i, (job, marker) in enumerate(zip(jobs, markers, strict=True))
        for step in job.steps
        if not same_eval(marker.get("evals", {}).get(str(step), {}).get("eval"), job.eval_key)
    ]
    if todo:
        _evaluate_batch(jobs, cfgs, markers, todo)
    outcomes = []
    for job, cfg, marker, (_, finished, _) in zip(jobs, cfgs, markers, states, strict=True):
        _prune(Path(job.out), cfg.steps)
        done = sum(1 for i, _ in todo if jobs[i] is job)
        outcomes.append({
            "models": {s: marker["evals"][str(s)]["result"] for s in job.steps},
            "reused_run": finished,
            "reused_evals": len(job.steps) - done,
            "train_seconds": marker.get("train_seconds"),
            "train_reward_first": marker.get("train_reward_first"),
            "train_reward_last": marker.get("train_reward_last"),
        })  # fmt: skip
    return outcomes


def _unevaluable(job: Job, marker: dict[str, Any]) -> bool:
    """Whether `job` asks for an evaluation its marker lacks of a checkpoint no longer there."""
    evals = marker.get("evals", {})
    return any(
        not same_eval(evals.get(str(s), {}).get("eval"), job.eval_key)
        and not _checkpoint_dir(Path(job.out), s).is_dir()
        for s in job.steps
    )


def _evaluate_batch(
    jobs: Sequence[Job], cfgs: Sequence[Any], markers: Sequence[dict[str, Any]],
    todo: Sequence[tuple[int, int]],
) -> None:  # fmt: skip
    """Evaluate the checkpoints `todo` ((job index, step) pairs) in one stacked program and
    write each result into its run's marker."""
    first = todo[0][0]
    paths = [_checkpoint_dir(Path(jobs[i].out), step) for i, step in todo]
    results = _evaluate_stacked(cfgs[first], paths, jobs[first].problems, jobs[first].eval_key)
    for (i, step), record, path in zip(todo, results, paths, strict=True):
        record["weights_sha256"] = weights_sha(path)
        markers[i]["evals"][str(step)] = {"eval": jobs[i].eval_key, "result": record}
    for i in sorted({i for i, _ in todo}):
        write_json(Path(jobs[i].out) / RUN_MARKER, markers[i])


def _evaluate_stacked(
    cfg: Any, paths: Sequence[Path], problems: list[Any], ev: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """`evaluate_model` of the model folders `paths` in one stacked program
    (`llm.eval.heldout.evaluate_models`), on ``system.device``: the batched engine's evaluations
    and a process engine's with ``eval.sampler = "stacked"``."""
    device = cfg.system.device
    models, tokenizer = [], None
    for path in paths:
        model, tokenizer = load_model_and_tokenizer(path, device, EVAL_PRECISION[cfg.eval.dtype])
        models.append(model)
    start = time.perf_counter()
    results = evaluate_models(
        models, tokenizer, cfg.task, problems, template=cfg.template,
        stop_token_ids=stop_token_ids(tokenizer, cfg.model_path), samples=ev["samples"],
        max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
        temperature=cfg.eval.temperature, top_p=cfg.eval.top_p, top_k=cfg.eval.top_k,
        seed=ev["seed"], prompts_per_batch=cfg.eval.prompts_per_batch, distinct=cfg.distinct,
        encoder=load_encoder(device) if ev["semantic"] else None,
    )  # fmt: skip
    seconds = (time.perf_counter() - start) / len(paths)
    del models
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the next run of this worker gets the memory back
    return [_record(r, ev["samples"], seconds) for r in results]


def _prune(out: Path, last: int) -> None:
    """Keep only the last checkpoint of a finished, evaluated run (it holds the optimizer state
    a longer rerun resumes from)."""

    keep = _checkpoint_dir(out, last)
    for p in (out / CHECKPOINTS).glob("*"):
        if p != keep and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def with_passk(record: Mapping[str, Any], ks: Sequence[int]) -> dict[str, Any]:
    """`record` with ``pass_at_k`` (unbiased estimator of Chen et al. 2021,
    `theory.measures.pass_at_k`, averaged over problems) for every k of `ks`, and ``pass1``."""

    n, correct = record["n"], record["correct"]
    passk = {str(k): float(np.mean([pass_at_k(n, c, k) for c in correct])) for k in ks}
    return {"pass_at_k": passk, "pass1": passk["1"], **record}


def problem_dict(p: Any) -> dict[str, Any]:
    """A problem as a JSON-able dict (tuples as lists)."""
    d = dataclasses.asdict(p) if dataclasses.is_dataclass(p) else {"problem": str(p)}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def eval_key(
    ev: Mapping[str, Any], base_cfg: Any, problems: Sequence[Any], source: str
) -> dict[str, Any]:
    """What identifies an evaluation: its settings, the problems' hash, the base config's sampling
    settings, the numeric settings and the code of a task of the user's own (`llm.tasks.Task.code`;
    an evaluation under others is not reused). ``ks`` is not part of it: pass@k for any k follows
    from the stored correct counts."""
    return {
        **{k: v for k, v in ev.items() if k != "ks"},
        "source": source,
        "problems_sha256": hashlib.sha256(
            json.dumps([problem_dict(p) for p in problems], sort_keys=True).encode()
        ).hexdigest(),
        "temperature": base_cfg.eval.temperature,
        "top_p": base_cfg.eval.top_p,
        "top_k": base_cfg.eval.top_k,
        "max_new_tokens": base_cfg.eval.max_new_tokens or base_cfg.rollout.max_new_tokens,
        "template": base_cfg.template,
        "distinct": base_cfg.distinct,
        "numerics": numerics.tag(),
        # Batching changes the samples (one seed per generate call), and so do the policy's dtype
        # and a GPU; named only when not the defaults, so that the CPU sweeps' caches stay valid.
        **{k: getattr(base_cfg.eval, k) for k in _BATCHING
           if getattr(base_cfg.eval, k) != getattr(_EVAL_DEFAULTS, k)},
        **({"sampler_version": SAMPLER_VERSION} if base_cfg.eval.sampler == "stacked" else {}),
        # A task of the user's own (--import): its code grades the samples.
        **({"task_code": TASKS[base_cfg.task].code} if TASKS[base_cfg.task].code else {}),
        **({"device": base_cfg.system.device, "tf32": base_cfg.system.tf32}
           if base_cfg.system.device != "cpu" else {}),
    }  # fmt: skip


_BATCHING = ("prompts_per_batch", "max_responses_per_call", "dtype", "sampler")
"""`[eval]` keys that change the samples besides the sampling settings: how the sampling is split
into generate calls (`evaluate_model`), the policy's dtype and the sampler."""
_EVAL_DEFAULTS = EvalConfig()


def collect(
    jobs: Sequence[Job], outcomes: Sequence[Mapping[str, Any]], ks: Sequence[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The results' ``models`` (the base model once, then one record per run and evaluated
    step, with pass@k for every k of `ks`) and ``runs`` (one record per trained run), from the
    jobs (the base model's first) and their outcomes (`run_job`)."""
    base = with_passk(outcomes[0]["models"][0], ks)
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
                 "step": step, "run": job.name, **with_passk(res["models"][step], ks)}
            )  # fmt: skip
    return models, runs
