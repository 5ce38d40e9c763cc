"""The LLM sweep file (``python -m llm sweep --config FILE``): its keys, their validation, and each
run's train config, resolved once (`llm.orchestrate.sweep` runs them).

A sweep TOML (``configs/sweep_countdown_tiny.toml``) holds the grammar both drivers share
(`experiment.spec`: ``seeds``, ``checkpoints``, ``reference``, ``tune``, ``[[methods]]`` with
``fixed``, ``grid``, ``zip`` or ``points``), ``base`` (the train config every run starts from,
relative to the sweep file), ``[train]`` (its overrides for every run) and ``[eval]`` (`SweepEval`:
every model on the same problems with the same sampling seed, so comparisons are paired). A
setting's key is a hyper-parameter of the method (``gamma_p``), a top-level train-config key
(``kl_coef``) or a dotted one (``optim.lr``, ``hyper.eta``, ``data.n_problems``); a removed spelling
(``lr``, `llm.config.OLD_KEYS`) is an error naming the new key.
``tune = { "optim.lr" = [1e-4, 2e-4] }`` crosses those values with every entry's settings, GRPO's
included (a setting then reads ``eta=0.1,optim.lr=0.0001``). Every run is evaluated at every
checkpoint, so each run is a path; the base model is step 0 of all. A setting may train its own
number of ``steps`` (e.g. GRPO's KL setting further, so that its curve reaches the methods'
pass@1): its runs are evaluated at the sweep's checkpoints up to its steps, continued at their
last spacing (`SweepSpec.checkpoints_of`).

`sweep_from_dict` validates every setting's train config once (`llm.config.config_from_dict`) and
keeps it (`SweepSpec.configs`, `run_config`): the jobs carry those objects, not raw tables.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import shaping
from experiment import schema
from experiment.schema import read_toml, refuse_moved
from experiment.spec import (
    COMMON_KEYS,
    Budget,
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
from llm.config import (
    MAX_EVAL_SAMPLES,
    OLD_KEYS,
    TrainConfig,
    config_from_dict,
    refuse_old_key,
    source_error,
)
from llm.eval.frontier import setting_name
from llm.eval.heldout import k_values

__all__ = [
    "MAX_EVAL_STREAM",
    "TUNING_KEYS",
    "Setting",
    "SweepEval",
    "SweepSpec",
    "budgets",
    "describe",
    "load_sweep",
    "merge_tables",
    "run_config",
    "run_name",
    "sweep_from_dict",
]

_TOP_KEYS = {*COMMON_KEYS, "base", "train", "eval"}
# Set per run by the sweep itself: a grid over them would break the paths or the pairing.
_RESERVED = {"method", "seed", "run.save_every", "model_path", "build_base_model", "eval"}


# ---------------------------------------------------------------------------------------------
# The sweep file


@dataclass
class SweepEval:
    """``[eval]``: the paired evaluation every model of the sweep gets."""

    problems: int = schema.option(0, ge=0)
    """the first N problems of the base config's [eval] source (0: its eval.n_problems)"""
    offset: int = schema.option(0, ge=0)
    """skip the first N problems (a confirmation stage's fresh problems)"""
    samples: int = schema.option(0, ge=0, le=MAX_EVAL_SAMPLES)
    """samples per problem n (0: the base config's eval.samples)"""
    ks: list[int] = field(default_factory=list, metadata=schema.meta(ge=1))
    """pass@k is reported for these k (default 1, 2, 4, ..., n)"""
    seed: int = 0
    """the sampling seed, the same for every model (paired)"""
    set: str = ""
    """the evaluation set, when the base config's source has several"""
    semantic: bool = False
    """also the MiniLM cosine among correct answers (needs the dsdr extra)"""


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
        key = refuse_old_key(spelt)
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
    base_raw = _base_doc(base, train)
    base_cfg = _resolved(base_raw, "train")

    seeds = list(parse_seeds(doc["seeds"]))
    checkpoints = list(parse_checkpoints(doc["checkpoints"], base_cfg.steps))

    # The run config's removed [eval] spellings (eval.n_samples) are the sweep's too.
    refuse_moved(doc, {k: v for k, v in OLD_KEYS.items() if k.startswith("eval.")})
    ev = schema.build(SweepEval, "eval", doc.get("eval", {}))
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
            configs.append(_resolved(run_raw, f"{where} {params}"))
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
        base_run_config=_resolved(base_run, "base"),
        configs=configs,
    )


TUNING_KEYS = ("optim.lr", "kl_coef", "steps")
"""A setting's keys that tune it rather than shape it (`budgets`; ``steps`` moves its
checkpoints)."""


def budgets(sweep: SweepSpec) -> list[Budget]:
    """Each setting's tuning (`experiment.spec.Budget`, for a study's equal-budget check): its
    learning rate and ``kl_coef`` as its runs train (`run_config`: base config, ``[train]``, the
    setting) and the checkpoints its models are read at (`SweepSpec.checkpoints_of`: every one)."""
    out = []
    for s in sweep.settings:
        cfg = run_config(sweep, s)
        own = {k: v for k, v in s.params.items() if k not in TUNING_KEYS}
        axes = {"optim.lr": float(cfg.optim.lr), "kl_coef": float(cfg.kl_coef),
                "checkpoints": tuple(sweep.checkpoints_of(s))}  # fmt: skip
        out.append(Budget(s.label, setting_name(own), axes))
    return out


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
        ValueError: invalid TOML or an invalid sweep (the message names the key and where its
            value came from: ``--set``, or the file and the key's line, `llm.config.source_error`).
        FileNotFoundError: no such file, or no such base config.
    """
    doc = apply_sets(read_toml(path), sets, _TOP_KEYS)
    try:
        spec = sweep_from_dict(doc, root=Path(path).resolve().parent)
    except ValueError as e:  # the file and the key's line, or --set for a key it gave
        given = [pair.split("=", 1)[0].strip() for pair in sets]
        raise source_error(path, e, given, given) from None
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


def _resolved(raw: Mapping[str, Any], where: str) -> TrainConfig:
    """`raw`, a run's train-config document, validated into the `TrainConfig` its jobs carry
    (`llm.config.config_from_dict`): once per config a sweep needs (`sweep_from_dict`).

    Raises:
        ValueError: ``WHERE: KEY ...`` for an unknown key or a bad value.
    """
    try:
        return config_from_dict(raw)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _base_doc(base: str | os.PathLike[str], train: Mapping[str, Any]) -> dict[str, Any]:
    """The base config file with the sweep's [train] overrides (validated by `sweep_from_dict`)."""
    return merge_tables(read_toml(base), train)


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


MAX_EVAL_STREAM = 8000
"""The most evaluation problems a sweep may draw (``eval.offset + eval.problems``): four times
`llm.model.tiny.HELDOUT_RESERVED`. The tiny held-out stream past its reserved prefix is drawn by
rejection, slower as its distribution runs out: 8000 problems took 18 s, 10000 over two minutes,
and an offset of 1e8 never ends."""
