"""Sweeps of shaping methods on an LLM task: ``python -m llm sweep --config FILE [--describe]``.

A sweep TOML (``configs/sweep_countdown_tiny.toml``) holds the grammar both drivers share
(`experiment.spec`: ``seeds``, ``checkpoints``, ``reference``, ``tune``, ``[[methods]]`` with
``fixed``, ``grid``, ``zip`` or ``points``), ``base`` (the train config every run starts from, relative to
the sweep file), ``[train]`` (its overrides for every run) and ``[eval]`` (`SweepEval`: every
model on the same problems with the same sampling seed, so comparisons are paired). A setting's
key is a hyper-parameter of the method (``gamma_p``), a top-level train-config key (``kl_coef``)
or a dotted one (``optim.lr``, ``hyper.eta``, ``data.n_problems``); a train-config key that moved
into a table (``lr``, `llm.config.MOVED_KEYS`) goes there, with a `FutureWarning`.
``tune = { "optim.lr" = [1e-4, 2e-4] }`` crosses those values with every entry's settings, GRPO's
included (a setting then reads ``eta=0.1,optim.lr=0.0001``). Every run is
evaluated at every checkpoint, so each run is a path; the base model is step 0 of all. A setting
may train its own number of ``steps`` (e.g. GRPO's KL setting further, so that its curve reaches
the methods' pass@1): its runs are evaluated at the sweep's checkpoints up to its steps,
continued at their last spacing (`SweepSpec.checkpoints_of`).

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

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numerics
import shaping
from experiment import report, schema
from experiment.reread import INPUTS
from experiment.spec import (
    COMMON_KEYS,
    apply_sets,
    extend_checkpoints,
    parse_checkpoints,
    parse_methods,
    parse_reference,
    parse_seeds,
)
from experiment.spec import (
    describe as describe_keys,
)
from experiment.store import config_error, read_toml, write_json
from llm.config import TrainConfig, config_from_dict, new_key, upgrade_keys
from llm.data import load_eval_sets, tiny_config
from llm.eval.frontier import frontier_analysis, frontier_inputs, save_inputs, write_reports
from llm.eval.heldout import k_values
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
from llm.rollout.stacked import VERSION as SAMPLER_VERSION
from llm.run.folder import RunLock
from llm.train.batched import VERSION as BATCHED_VERSION
from llm.train.batched import batch_key, batchable

__all__ = [
    "Setting",
    "SweepSpec",
    "describe",
    "load_sweep",
    "rerun_runs",
    "run_config",
    "run_fingerprint",
    "run_name",
    "run_sweep",
    "sweep_from_dict",
    "sweep_jobs",
]

RESULTS = "results.json"

_TOP_KEYS = {*COMMON_KEYS, "base", "train", "eval"}
# Set per run by the sweep itself: a grid over them would break the paths or the pairing.
_RESERVED = {"method", "seed", "run.save_every", "model_path", "build_base_model", "eval"}


# ---------------------------------------------------------------------------------------------
# The sweep file


@dataclass
class SweepEval:
    """``[eval]``: the paired evaluation every model of the sweep gets."""

    problems: int = schema.option(
        0, "the first N problems of the base config's [eval] source (0: its eval.n_problems)", ge=0
    )
    offset: int = schema.option(
        0, "skip the first N problems (a confirmation stage's fresh problems)", ge=0
    )
    samples: int = schema.option(
        0, "samples per problem n (0: the base config's eval.samples)", ge=0
    )
    ks: list[int] = field(
        default_factory=list,
        metadata=schema.meta("pass@k is reported for these k (default 1, 2, 4, ..., n)", ge=1),
    )
    seed: int = schema.option(0, "the sampling seed, the same for every model (paired)")
    set: str = schema.option("", "the evaluation set, when the base config's source has several")
    semantic: bool = schema.option(
        False, "also the MiniLM cosine among correct answers (needs the dsdr extra)"
    )


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
    base_config: TrainConfig | None = None
    """the base config with ``[train]``, resolved once by `sweep_from_dict`"""
    base_run_config: TrainConfig | None = None
    """the base model's evaluation job's config (a run of the base config's method, seed 0, as
    `run_config`'s), resolved once"""
    configs: list[TrainConfig] = field(default_factory=list)
    """each setting's run config (its first seed's; `run_config`), resolved once by
    `sweep_from_dict`, in the order of `settings`"""

    def checkpoints_of(self, setting: Setting) -> list[int]:
        """The steps at which `setting`'s runs are evaluated: the sweep's `checkpoints`, or, for
        a setting with its own ``steps`` (GRPO's KL setting trained further, say), those
        continued at their last spacing up to its steps (`experiment.spec.extend_checkpoints`)."""
        return list(extend_checkpoints(self.checkpoints, setting.params.get("steps", self.steps)))

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
    for spelt, value in params.items():
        key = new_key(spelt)  # an old flat key (lr) is its table's key (optim.lr)
        head = key.split(".")[0]
        if head in _RESERVED or key in _RESERVED:
            raise ValueError(
                f"{where}.{spelt}: set by the sweep itself (see seeds, checkpoints, eval)"
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


def merge_tables(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of the TOML tree `a` with `b`'s keys set over it, sub-table by sub-table."""
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = (
            merge_tables(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
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
        base_raw = _base_doc(base, train)
        base_cfg = config_from_dict(base_raw)
    except ValueError as e:
        raise ValueError(f"train: {e}") from None

    seeds = list(parse_seeds(doc["seeds"]))
    checkpoints = list(parse_checkpoints(doc["checkpoints"], base_cfg.steps))

    try:
        ev = schema.from_dict(SweepEval, doc.get("eval", {}))
    except (TypeError, ValueError) as e:
        raise ValueError(f"eval: {e}") from None
    try:
        schema.check_fields(ev)
    except ValueError as e:
        raise ValueError(f"eval.{e}") from None
    samples = ev.samples or base_cfg.eval.samples
    ks = ev.ks or k_values(samples)
    if max(ks) > samples:
        raise ValueError(f"eval.ks: expected a list of k in [1, samples = {samples}], got {ks!r}")
    problems = ev.problems or base_cfg.eval.n_problems
    if ev.offset + problems > MAX_EVAL_STREAM:
        raise ValueError(
            f"eval.offset: expected offset + problems <= {MAX_EVAL_STREAM}, got {ev.offset} + "
            f"{problems}"
        )
    evald = {
        "problems": problems,
        # Only when set: an evaluation's key (and the results' bytes) without it stay as before.
        **({"offset": ev.offset} if ev.offset else {}),
        "samples": samples,
        "seed": ev.seed,
        "set": ev.set or None,
        "semantic": ev.semantic,
        "ks": sorted({1, *ks}),  # pass@1 is the frontier's x axis
    }

    entries = parse_methods(doc["methods"], _check_key, doc.get("tune"))
    settings: list[Setting] = []
    configs: list[TrainConfig] = []
    for entry in entries:
        where = f"methods[{entry.label}]"
        for point in entry.points:
            params = {**entry.fixed, **point}
            setting = Setting(entry.label, entry.method, params)
            steps = params.get("steps", base_cfg.steps)
            if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
                raise ValueError(f"{where}.steps: expected an integer >= 1, got {steps!r}")
            own = list(extend_checkpoints(checkpoints, steps))
            run_raw = _run_raw(base_raw, setting, seeds[0], own, where)
            try:
                configs.append(config_from_dict(run_raw))
            except ValueError as e:
                raise ValueError(f"{where} {params}: {e}") from None
            settings.append(setting)
    reference = list(parse_reference(doc.get("reference"), entries))
    base_run = _run_raw(base_raw, Setting("base", base_cfg.method, {}), 0, checkpoints)
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
        base_config=base_cfg,
        base_run_config=config_from_dict(base_run),
        configs=configs,
    )


def describe() -> str:
    """Every key of an LLM sweep file with its help (``python -m llm sweep --describe``)."""
    return describe_keys(
        {"eval": SweepEval},
        [("base", "the train config every run starts from (a path relative to the sweep file)"),
         ("train", "a table of overrides of the base config for every run (steps, optim.lr, ...)")],
    )  # fmt: skip


def load_sweep(path: str | os.PathLike[str], sets: Iterable[str] = ()) -> SweepSpec:
    """Read a sweep TOML, apply ``--set`` pairs (`apply_sets`) and validate it (`sweep_from_dict`).

    Raises:
        ValueError: invalid TOML or an invalid sweep (the message names the file, the key and
            the key's line, `experiment.store.config_error`).
        FileNotFoundError: no such file, or no such base config.
    """
    doc = apply_sets(read_toml(path), sets, _TOP_KEYS)
    try:
        spec = sweep_from_dict(doc, root=Path(path).resolve().parent)
    except ValueError as e:
        given = [pair.split("=", 1)[0].strip() for pair in sets]
        raise config_error(path, e, given) from None
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
    out = merge_tables(out, _split_params(setting.method, setting.params, where or setting.label))
    per_run = {
        "method": setting.method,
        "seed": seed,
        "build_base_model": False,
        "system": {"num_threads": 1},
        "run": {"save_every": math.gcd(*checkpoints), "tensorboard": False},
    }
    return merge_tables(out, per_run)


def _base_doc(base: str | os.PathLike[str], train: Mapping[str, Any]) -> dict[str, Any]:
    """The base config file with the sweep's [train] overrides, each in the current layout
    (`llm.config.upgrade_keys`)."""
    return merge_tables(upgrade_keys(read_toml(base)), upgrade_keys(train))


def run_config(spec: SweepSpec, setting: Setting, seed: int | None = None) -> TrainConfig:
    """The train config of `setting`'s run with `seed` (default: the sweep's first seed; the runs
    differ in ``seed`` alone), as the sweep trains it: the base config, ``[train]``, the setting's
    values, one thread, a checkpoint at every evaluated step; resolved once by `sweep_from_dict`.

    Raises:
        ValueError: `setting` is not one of `spec`'s.
    """
    if setting not in spec.settings:
        raise ValueError(f"setting: {setting.label} {setting.params} is not one of the sweep's")
    cfg = spec.configs[spec.settings.index(setting)]
    return cfg if seed is None else dataclasses.replace(cfg, seed=seed)


def run_name(setting: Setting, seed: int) -> str:
    """Folder name of one run: ``<label>[_<key>=<value>...]_seed<s>``."""
    parts = [setting.label, *(f"{k}={v}" for k, v in setting.params.items()), f"seed{seed}"]
    return re.sub(r"[^A-Za-z0-9_.=+-]", "-", "_".join(parts))


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


MAX_EVAL_STREAM = 8000
"""The most evaluation problems a sweep may draw (``eval.offset + eval.problems``): four times
`llm.model.tiny.HELDOUT_RESERVED`. The tiny held-out stream past its reserved prefix is drawn by
rejection, slower as its distribution runs out: 8000 problems took 18 s, 10000 over two minutes,
and an offset of 1e8 never ends."""

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
    (`llm.rollout.stacked.VERSION` 2), to the bit (tests/llm/test_batched.py)."""
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
    """Whether `engine` can run `spec`'s runs.

    Raises:
        ValueError: an unknown engine, or ``batched`` with ``eval.dtype`` other than float32 (the
            stacked sampler holds float32 weights only: `llm.model.stacked`).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    dtype = spec.base_config.eval.dtype
    if engine == "batched" and dtype != "float32":
        raise ValueError(f"eval.dtype: {dtype!r} needs the process engine (the batched engine's "
                         "stacked sampler holds float32 weights only)")  # fmt: skip


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
) -> dict[str, Any]:
    """Train and evaluate every (setting, seed) of `spec` into `out` and write ``results.json``.
    Without `progress`, `log` prints a line per finished run
    (`llm.orchestrate.executor.LineProgress`).

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
            run_bars=progress and executor == "local" and workers <= 1,
        )  # fmt: skip
        t0 = time.perf_counter()
        units = [[j] for j in jobs] if engine == "process" else pack_jobs(jobs, workers, max_batch)
        done = map_jobs(
            run_unit, units, workers=workers, progress=progress, desc="runs (train + eval)",
            name=lambda u: u[0].name if len(u) == 1 else f"{u[0].name} +{len(u) - 1}",
            executor=executor, address=address, log=log,
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
        inputs = frontier_inputs(results)
        results["frontier"] = frontier_analysis(results, num_resamples=num_resamples, inputs=inputs)
        write_reports(results, out / "frontier.png", out / "lifts.md")
        save_inputs(results, out / INPUTS, inputs, num_resamples=num_resamples)
        results["timings_seconds"]["frontier"] = round(time.perf_counter() - t0, 1)
        results["timings_seconds"]["total"] = round(time.perf_counter() - t_start, 1)
        write_json(out / RESULTS, results)
        return results


def sweep_jobs(
    spec: SweepSpec, out: Path, *, engine: str, workers: int, progress: bool, run_bars: bool
) -> tuple[list[Job], TrainConfig, str, list[Any], dict[str, Any]]:
    """Every job of `spec` under `out` (the base model's evaluation first, then each setting ×
    seed in file order), with the base config, the base weights' SHA-256, the problems and the
    evaluation key; builds the base model when the config asks (here, once: workers building it
    side by side would race on the folder). `run_bars`: each run's own progress bar.

    Raises:
        ValueError: an unknown `engine`, or evaluation settings the problem set cannot meet.
    """
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
        for seed in spec.seeds:
            name = run_name(setting, seed)
            jobs.append(
                Job(name, setting, seed, run_config(spec, setting, seed),
                     str(out / "runs" / name), base_sha, spec.checkpoints_of(setting), problems,
                     eval_key, run_bars)
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
) -> dict[str, str]:
    """Train and evaluate the runs `names` of `spec` (``"base"``: the base model's evaluation)
    into `out` as `run_sweep` would, on local workers, and return their `run_fingerprint`s:
    each run alone (under engine ``batched``, a batch of one: a run's bytes do not depend on its
    batch, `pack_jobs`). A spot check of a study on another machine
    (`llm.orchestrate.study.spot_check`).

    Raises:
        ValueError: a name that is not a run of `spec` (the message lists a few that are), or as
            `run_sweep`.
    """
    out = Path(out)
    workers = default_workers() if workers is None else workers
    with RunLock(out):  # one sweep per folder (`run_sweep`)
        jobs, *_ = sweep_jobs(spec, out, engine=engine, workers=workers, progress=progress,
                               run_bars=progress and workers <= 1)  # fmt: skip
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
