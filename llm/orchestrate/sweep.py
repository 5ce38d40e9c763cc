"""Sweeps of shaping methods on an LLM task: ``python -m llm sweep --config FILE [--describe]``
runs every (setting, seed) of a sweep file (`llm.orchestrate.sweep_spec`: its keys, validation and
each run's config) and reads the frontier.

The runs go to local worker processes or to Ray tasks, on this machine or a cluster
(`llm.orchestrate.executor`; `llm.orchestrate.jobs`: reuse, resume and pruning of runs). Writes
``OUT/results.json`` (the schema of `experiment.report`; per model and seed pass@k for every k
from the per-problem counts, distinct correct solutions, the counts; under ``frontier`` each
model's lift at matched pass@1 over the reference curve; under ``fingerprints`` each run's
`run_fingerprint`), ``OUT/frontier.png``,
``OUT/lifts.md`` (`llm.eval.frontier`) and ``OUT/lift_inputs.npz`` (the lift analysis' inputs, for
a later procedure's re-read: `experiment.reread`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import numerics
from experiment import report
from experiment.reread import INPUTS
from experiment.store import read_json, write_json
from llm.config import TrainConfig
from llm.data import load_eval_sets, tiny_config
from llm.eval.frontier import frontier_analysis, frontier_inputs, save_inputs, write_reports
from llm.model.stacked import folder_refusal
from llm.model.tiny import ensure_base_model
from llm.orchestrate.executor import check_executor
from llm.orchestrate.jobs import (
    Job,
    collect,
    default_workers,
    map_jobs,
    problem_dict,
    run_batch,
    run_job,
    weights_sha,
)
from llm.orchestrate.jobs import eval_key as jobs_eval_key
from llm.orchestrate.sweep_spec import SweepSpec, run_config, run_name
from llm.rollout.stacked import VERSION as SAMPLER_VERSION
from llm.run.folder import RunLock
from llm.train.batched import VERSION as BATCHED_VERSION
from llm.train.batched import batch_key, batchable

__all__ = [
    "ENGINES",
    "MAX_BATCH",
    "check_engine",
    "measured_costs",
    "pack_jobs",
    "rerun_runs",
    "run_fingerprint",
    "run_sweep",
    "sweep_jobs",
]

RESULTS = "results.json"

# ---------------------------------------------------------------------------------------------
# The driver


def _eval_problems(spec: SweepSpec, base_cfg: Any) -> tuple[list[Any], str]:
    """The paired evaluation problems: ``eval.problems`` of the base config's [eval] source after
    the first ``eval.offset`` (set ``eval.set`` when it names several)."""

    offset = spec.eval.get("offset", 0)
    cfg = dataclasses.replace(
        base_cfg, eval=dataclasses.replace(base_cfg.eval, n_problems=offset + spec.eval["problems"])
    )
    sets = load_eval_sets(cfg)
    name = spec.eval["set"] or next(iter(sets))
    if name not in sets:
        raise ValueError(f"eval.set: expected one of {sorted(sets)}, got {name!r}")
    problems = sets[name][offset : offset + spec.eval["problems"]]
    if len(problems) < spec.eval["problems"]:
        raise ValueError(
            f"eval.problems: {spec.eval['problems']} asked after offset {offset}, the set "
            f"{name!r} has {len(problems)} there"
        )
    return problems, f"{base_cfg.eval.source}:{name}"


ENGINES = ("process", "batched")
"""How a sweep trains its runs (`run_sweep`'s `engine`)."""

MAX_BATCH = 8
"""Runs per batch at most: measured on the tiny model (`bench/bench_batched.py`), the time per
run stops falling beyond about 8 runs (its forward is compute-bound), and 8 runs' weights,
optimizer state and KV cache take ~100 MB."""


def pack_jobs(jobs: list[Job], workers: int, max_batch: int = MAX_BATCH) -> list[list[Job]]:
    """The units of a batched sweep: the base model's evaluation alone, the runs that cannot be
    batched (`llm.train.batched.batchable`) alone, and the others grouped by
    `llm.train.batched.batch_key`, in file order, into batches of
    ``min(max_batch, ceil(group / workers))`` runs (the last one smaller), so that every worker
    gets a batch.

    The batches follow the worker count, and results do not: a run trains in a batch as alone
    (`llm.train.batched.VERSION` 2) and a stacked evaluation samples each model as alone
    (`llm.rollout.stacked.VERSION` 2), to the bit on the CPU (tests/llm/test_batched.py; on a GPU
    the kernels' choice may follow the batch)."""
    units: list[list[Job]] = []
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        if job.setting is None or batchable(job.cfg) is not None:
            units.append([job])
        else:
            groups.setdefault(batch_key(job.cfg), []).append(job)
    for group in groups.values():
        size = max(1, min(max_batch, math.ceil(len(group) / max(1, workers))))
        units.extend(group[i : i + size] for i in range(0, len(group), size))
    return units


def unit_gpus(unit: list[Job]) -> float:
    """GPUs a unit's Ray task asks for (`llm.orchestrate.executor.ray_task_options`): 1 when a
    job of it trains on CUDA (``system.device``, "cuda" or "cuda:N": one process, one device),
    else 0."""
    return 1.0 if any(j.cfg.system.device.startswith("cuda") for j in unit) else 0.0


def run_unit(unit: list[Job]) -> list[dict[str, Any]]:
    """`llm.orchestrate.jobs.run_job` of a one-job unit that is not a batched run (the base model's
    evaluation, the process engine, a run `llm.train.batched.batchable` refuses),
    `llm.orchestrate.jobs.run_batch` of the others (module level: workers pickle it by
    reference)."""
    job = unit[0]
    if len(unit) == 1 and (
        job.setting is None
        or job.eval_key.get("engine") != "batched"
        or batchable(job.cfg) is not None
    ):
        return [run_job(job)]
    return run_batch(unit)


def check_engine(spec: SweepSpec, engine: str) -> None:
    """Whether `engine` can run `spec`'s runs: every engine runs every sweep of a model it can
    stack (the batched engine trains the runs `llm.train.batched.batchable` refuses alone, and its
    stacked evaluation samples in either ``eval.dtype``); the batched engine evaluates every model
    stacked, so a model folder `llm.model.stacked` cannot stack (not a Llama) is refused here,
    before any run (the tiny base model, built on first use, is a Llama).

    Raises:
        ValueError: an unknown engine; engine ``batched`` with a model it cannot stack (naming the
            folder, the reason and ``--engine process``).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    base = spec.base_config
    if engine == "batched" and not base.build_base_model:
        reason = folder_refusal(base.model_path)
        if reason is not None:
            raise ValueError(f"engine batched: the model {base.model_path} cannot be stacked "
                             f"({reason}; llm.model.stacked): run this sweep with --engine "
                             "process")  # fmt: skip


def run_sweep(
    spec: SweepSpec,
    out: str | os.PathLike[str],
    *,
    workers: int | None = None,
    progress: bool = True,
    num_resamples: int = 1000,
    executor: str = "local",
    address: str | None = None,
    engine: str = "process",
    max_batch: int = MAX_BATCH,
    log: bool = False,
    labels: Sequence[str] | None = None,
    steps: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Train and evaluate every (setting, seed) of `spec` into `out` and write ``results.json``.
    Without `progress`, `log` prints a line per finished run
    (`llm.orchestrate.executor.LineProgress`).

    `labels`: train only these method labels' runs (with the base model's evaluation); without
    every reference label among them the lift analysis is left to the caller (no ``frontier``,
    lift tables or figure: `experiment.extend` merges the runs with a committed reference).
    `steps`: per label the checkpoints to evaluate (default every checkpoint of
    `SweepSpec.checkpoints_of`), e.g. a confirmed pick's one step.

    `engine`: ``process`` trains each run alone in a worker (`llm.train.trainer.train`, sampling
    with transformers' `generate`); ``batched`` packs the runs that can share a batch
    (`pack_jobs`) into batches of at most `max_batch` runs, each trained as one program with
    its evaluations (`llm.orchestrate.jobs.run_batch`; the base model too is evaluated by the
    stacked sampler), and trains the others alone. The engines draw different random streams: a
    run's results depend on the engine, which its marker and the evaluation key record.

    The runs go to `executor` (`llm.orchestrate.executor.map_jobs`): ``local`` worker processes
    (`workers`, default one per core) or ``ray`` tasks on the Ray instance at `address` (None: a
    local one of `workers` CPUs); on a cluster, every node reads the base model and writes the
    run folders under `out`, so both must be on a filesystem all nodes share.

    Returns:
        The results mapping (see the module docstring): ``settings``, ``problems``, ``models``
        (one record per label, parameters, seed and step; step 0 is the base model, listed once
        with label ``base``), ``runs``, ``reused`` and ``timings_seconds``.

    Raises:
        ValueError: invalid evaluation settings (e.g. more problems than the set holds), an
            unknown executor, or `address` without executor ``ray``.
        ImportError: executor ``ray`` without Ray installed.
        llm.run.folder.RunFolderError: another live sweep or study holds `out` (its PID named).
    """

    t_start = time.perf_counter()
    check_executor(executor, address)
    out = Path(out)
    # One sweep per folder: a second one is refused (naming this one's PID) before it reads or
    # writes anything there; a failed start leaves no folder behind.
    with RunLock(out):
        workers = default_workers() if workers is None else workers
        jobs, base_cfg, base_sha, problems, eval_key = sweep_jobs(
            spec, out, engine=engine, workers=workers, progress=progress,
            run_bars=progress and executor == "local" and workers <= 1, labels=labels, steps=steps,
        )  # fmt: skip
        t0 = time.perf_counter()
        units = [[j] for j in jobs] if engine == "process" else pack_jobs(jobs, workers, max_batch)
        done = map_jobs(
            run_unit, units, workers=workers, progress=progress, desc="runs (train + eval)",
            name=lambda u: u[0].name if len(u) == 1 else f"{u[0].name} +{len(u) - 1}",
            executor=executor, address=address, gpus_per_job=unit_gpus, log=log,
        )  # fmt: skip
        by_name = {j.name: o for unit, res in zip(units, done, strict=True)
                   for j, o in zip(unit, res, strict=True)}  # fmt: skip
        outcomes = [by_name[j.name] for j in jobs]
        t_runs = time.perf_counter() - t0

        models, runs = collect(jobs, outcomes, spec.eval["ks"])
        fingerprints = {j.name: run_fingerprint(o) for j, o in zip(jobs, outcomes, strict=True)}
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
                "lr": base_cfg.optim.lr,
                "group_size": base_cfg.rollout.group_size,
                "prompts_per_step": base_cfg.rollout.prompts_per_step,
                "checkpoints": spec.checkpoints,
                "seeds": spec.seeds,
                "reference": spec.reference,
                "labels": spec.labels,
                "settings": [dataclasses.asdict(s) for s in spec.settings],
                "eval": {**eval_key, "ks": spec.eval["ks"]},
                "workers": workers,
                "executor": executor,
                "engine": engine,
                "batches": [len(u) for u in units],
            },
            "problems": [problem_dict(p) for p in problems],
            "models": models,
            "runs": runs,
            "reused": {
                "runs": sum(1 for r in outcomes[1:] if r["reused_run"]),
                "of": len(jobs) - 1,
                "evals": sum(r["reused_evals"] for r in outcomes),
                "evals_of": sum(len(j.steps) for j in jobs),
            },
            "fingerprints": fingerprints,
            "timings_seconds": {
                "runs": round(t_runs, 1),
                "total": round(time.perf_counter() - t_start, 1),
            },
        }
        t0 = time.perf_counter()
        if labels is None or set(spec.reference) <= set(labels):
            inputs = frontier_inputs(results)
            results["frontier"] = frontier_analysis(results, num_resamples=num_resamples,
                                                    inputs=inputs)  # fmt: skip
            write_reports(results, out / "frontier.png", out / "lifts.md")
            save_inputs(results, out / INPUTS, inputs, num_resamples=num_resamples)
        results["timings_seconds"]["frontier"] = round(time.perf_counter() - t0, 1)
        results["timings_seconds"]["total"] = round(time.perf_counter() - t_start, 1)
        write_json(out / RESULTS, results)
        return results


def sweep_jobs(
    spec: SweepSpec,
    out: Path,
    *,
    engine: str,
    workers: int,
    progress: bool,
    run_bars: bool,
    labels: Sequence[str] | None = None,
    steps: Mapping[str, Sequence[int]] | None = None,
) -> tuple[list[Job], TrainConfig, str, list[Any], dict[str, Any]]:
    """Every job of `spec` under `out` (the base model's evaluation first, then each setting ×
    seed in file order; of `labels` alone when given), with the base config, the base weights'
    SHA-256, the problems and the evaluation key; builds the base model when the config asks
    (here, once: workers building it side by side would race on the folder). `run_bars`: each
    run's own progress bar; `steps`: per label the checkpoints to evaluate (`run_sweep`).

    Raises:
        ValueError: an unknown `engine` or label, a step that is not a checkpoint of its label,
            or evaluation settings the problem set cannot meet.
    """
    unknown = sorted(set(labels or ()) - set(spec.labels))
    if unknown:
        raise ValueError(f"labels: {unknown} are not labels of the sweep ({spec.labels})")
    base_cfg = spec.base_config
    if base_cfg.build_base_model:
        # On ensure_base_model's fixed thread count, whatever `workers` is: under numerics pin 2
        # the warm start's bytes depend on the thread count (1 and 2 threads gave other bases).
        ensure_base_model(base_cfg.model_path, config=tiny_config(base_cfg), progress=progress)
    base_sha = weights_sha(base_cfg.model_path)
    problems, source = _eval_problems(spec, base_cfg)
    check_engine(spec, engine)
    eval_key = jobs_eval_key(spec.eval, base_cfg, problems, source)
    (out / "runs").mkdir(parents=True, exist_ok=True)  # once the settings are checked
    if engine == "batched":
        eval_key["engine"] = "batched"
        eval_key["batched_version"] = BATCHED_VERSION
        eval_key["sampler_version"] = SAMPLER_VERSION
    jobs = [Job("base", None, 0, spec.base_run_config, str(out), base_sha, [0], problems, eval_key,
                False)]  # fmt: skip
    for setting in spec.settings:
        if labels is not None and setting.label not in labels:
            continue
        read = spec.checkpoints_of(setting)
        if steps is not None and setting.label in steps:
            wanted = [int(s) for s in steps[setting.label]]
            if not wanted or set(wanted) - set(read):
                raise ValueError(f"steps: {setting.label}: {wanted} are not among its checkpoints "
                                 f"{read}")  # fmt: skip
            read = sorted(set(wanted))
        for seed in spec.seeds:
            name = run_name(setting, seed)
            jobs.append(
                Job(name, setting, seed, run_config(spec, setting, seed),
                     str(out / "runs" / name), base_sha, read, problems, eval_key, run_bars)
            )  # fmt: skip
    return jobs, base_cfg, base_sha, problems, eval_key


FINGERPRINTED = ("weights_sha256", "correct", "distinct", "accuracy", "distinct_correct",
                 "self_bleu", "semantic_cosine_correct")  # fmt: skip
"""The fields of a run's evaluation records that `run_fingerprint` covers (not its timings)."""


def run_fingerprint(outcome: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of a run's results: at every evaluated step, the checkpoint's weights
    (`llm.orchestrate.jobs.weights_sha`) and its per-problem counts, accuracy, distinct correct and
    Self-BLEU (`FINGERPRINTED`), as canonical JSON. Two machines that train and evaluate a run
    alike give the same fingerprint; a study records them (`rerun_runs` checks them).

    Args:
        outcome: a `llm.orchestrate.jobs.run_job` outcome (``{"models": {step: record}, ...}``).
    """
    models = outcome["models"]
    doc = {str(step): {k: models[step].get(k) for k in FINGERPRINTED}
           for step in sorted(models, key=int)}  # fmt: skip
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def rerun_runs(
    spec: SweepSpec,
    out: str | os.PathLike[str],
    names: Iterable[str],
    *,
    engine: str,
    workers: int | None = None,
    progress: bool = True,
    log: bool = False,
    steps: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, str]:
    """Train and evaluate the runs `names` of `spec` (``"base"``: the base model's evaluation)
    into `out` as `run_sweep` would, on local workers, and return their `run_fingerprint`s:
    each run alone (under engine ``batched``, a batch of one: a run's bytes do not depend on its
    batch, `pack_jobs`). `steps`: per label the checkpoints evaluated (`run_sweep`; an extension's
    confirmation evaluates each pick at its step alone). A spot check of a study on another
    machine (`llm.orchestrate.spot_check.spot_check`).

    Raises:
        ValueError: a name that is not a run of `spec` (the message lists a few that are), or as
            `run_sweep`.
    """
    out = Path(out)
    workers = default_workers() if workers is None else workers
    with RunLock(out):  # one sweep per folder (`run_sweep`)
        jobs, *_ = sweep_jobs(spec, out, engine=engine, workers=workers, progress=progress,
                               run_bars=progress and workers <= 1, steps=steps)  # fmt: skip
        by_name = {j.name: j for j in jobs}
        wanted = list(dict.fromkeys(names))
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            raise ValueError(
                f"runs: {unknown} are not runs of the sweep (e.g. {list(by_name)[:3]})"
            )
        units = [[by_name[n]] for n in wanted]
        done = map_jobs(run_unit, units, workers=workers, progress=progress,
                        desc="runs (spot check)", name=lambda u: u[0].name, executor="local",
                        address=None, log=log)  # fmt: skip
    return {u[0].name: run_fingerprint(r[0]) for u, r in zip(units, done, strict=True)}


def measured_costs(runs_dir: Path) -> dict[str, Any] | None:
    """The cost model of `experiment.study.design_for` from a sweep's finished runs
    (``RUNS/*/sweep_run.json``): the median training time of a run and the median, over runs, of
    the evaluation time per problem summed over the run's checkpoints, in seconds of one worker
    (one core; process start-up not counted). None when no run has both."""
    train, per_problem = [], []
    for marker in sorted(Path(runs_dir).glob("*/sweep_run.json")):
        doc = read_json(marker)
        evals = [e["result"] for e in doc.get("evals", {}).values()
                 if "eval_seconds" in e.get("result", {})]  # fmt: skip
        if doc.get("train_seconds") is not None and doc.get("finished") and evals:
            train.append(float(doc["train_seconds"]))
            per_problem.append(sum(r["eval_seconds"] / len(r["correct"]) for r in evals))
    if not train:
        return None
    return {"run": float(np.median(train)), "problem": float(np.median(per_problem)),
            "unit": "core-s"}  # fmt: skip
