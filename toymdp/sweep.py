"""`python -m toymdp sweep --config FILE [--out DIR]`: hyper-parameter sweeps and trade-off frontiers.

A TOML file holds the sweep grammar both drivers share (`experiment.spec`: ``seeds``,
``checkpoints``, ``reference``, ``tune``, ``[[methods]]`` with ``fixed``, ``grid``, ``zip`` or
``points``),
the toy's ``[env]`` (`toymdp.sweep_spec.EnvSpec`), ``[train]`` (`toymdp.sweep_spec.TrainSpec`) and ``[frontier]``
(``num_resamples``); see ``configs/toy/*.toml`` and ``python -m toymdp sweep --describe``.
A setting's keys are the method's hyper-parameters and ``lr``; ``tune = { lr = [0.03, 0.1],
kl_coef = [0.0, 0.3] }`` crosses those values with every entry's settings, GRPO's included.
``seeds = [0, 1, 2, 3]`` are the indices of the training keys split from ``train.seed``;
``checkpoints`` are update counts (step 0, the base policy, is always evaluated).

Execution (PureJaxRL style): float hyper-parameters of a method and the learning rate are
*data* (`toymdp.train.TrainConfig.swept_names`), so each entry is one compiled program, `vmap`
over draws × settings × seeds; the environment's arrays are data too. Non-float values in a
grid (CaSP's `top_n`, pass@k training's `k`, ...) change the program: one compilation per value.

Outputs in OUT (default ``runs/toy_sweep/<config stem>``): ``results.json`` (the schema of
`experiment.report`, plus ``runs``: per entry × setting its metrics, means over the training and
the held-out prompts, axes `(D draws, R seeds, T eval steps[, k])`), ``frontier.png`` and
``lifts.md`` (`experiment.report`: lift at matched pass@1 over the reference curve, every
checkpoint of every setting, as the LLM sweep reads its runs (`read_steps`: each run a path, so a
method is early-stopped as GRPO is); `experiment.inference.lift_inference` over seeds × draws) and
``lift_inputs.npz`` (the lift analysis' inputs, for a later procedure's re-read: `experiment.reread`).
Results are cached in ``OUT/.cache/sweep-<code hash>-<config hash>.npz``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import numerics
import shaping
from experiment import frontier, report, reread, spec, store
from experiment.cli import progress_bar
from experiment.lock import RunLock
from toymdp import train as T
from toymdp.engine import RUN_SOURCES, code_hash, jax_cache, run_over_draws
from toymdp.env import TreeEnv
from toymdp.environments import environments
from toymdp.sweep_spec import SweepConfig, is_data, load_config

METRICS = (
    "correctness",
    "pass_at_k",
    "distinct_correct",
    "normalized_variance",
    "kl_to_base",
    "entropy",
)


@dataclass(frozen=True)
class Run:
    """One row of the sweep: an entry and one of its settings."""

    label: str
    method: str
    values: dict[str, object]  # the swept values (grid, zip or points) of this row
    static: dict[str, object]  # non-float values (fixed by the compiled program)

    def setting(self) -> str:
        """A short label, e.g. ``"gamma_p=0.1, gamma_n=0.05"`` (``"default"`` without a grid)."""
        return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in self.values.items()) or "default"  # fmt: skip


def all_rows(cfg: SweepConfig) -> list[Run]:
    """Every row of the sweep, entries in config order, settings in `MethodEntry.points` order."""
    return [
        Run(m.label, m.method, dict(p), {k: v for k, v in p.items() if not is_data(m.method, k)})
        for m in cfg.methods
        for p in m.points
    ]


def _train_config(
    cfg: SweepConfig, env: TreeEnv, entry: spec.MethodEntry, static: Mapping
) -> T.TrainConfig:
    tr = cfg.train
    hyper = {"kl_coef": tr.kl_coef, **entry.fixed, **static}
    try:
        return T.TrainConfig(
            env, method=entry.method, method_hyper=hyper, group_size=tr.group_size,
            num_updates=tr.updates, num_epochs=tr.epochs, optimizer=tr.optimizer,
            learning_rate=tr.lr, pass_k=tr.pass_k, distinct_k=(tr.distinct_k,),
        )  # fmt: skip
    except ValueError as err:
        raise ValueError(f"methods[{entry.label}]: {err}") from None


def run_program(
    cfg: SweepConfig, envs: Sequence[TreeEnv], entry: spec.MethodEntry, runs: Sequence[Run]
) -> dict[str, np.ndarray]:
    """Train the rows `runs` (sharing one `static` combination) on every draw × seed, compiled
    once.

    Returns:
        `{metric: (N rows, D draws, R seeds, T eval steps, P[, k])}` per-prompt exact metrics.
    """
    config = _train_config(cfg, envs[0], entry, runs[0].static)
    settings = T.stack_settings([
        T.default_settings(config, **{k: float(v) for k, v in r.values.items() if k not in r.static})
        for r in runs
    ])  # fmt: skip
    keys = T.seed_keys(cfg.train.seed, max(cfg.seeds) + 1)[np.asarray(cfg.seeds)]
    return run_over_draws(config, envs, settings, keys, cfg.eval_steps, METRICS,
                          fast_compile=cfg.train.fast_compile)  # fmt: skip


def run_sweep(cfg: SweepConfig, progress: bool = True) -> dict[str, Any]:
    """Every entry of `cfg` (one compiled program per entry and non-float grid combination).

    Returns:
        ``rows`` (the `Run`s, in order), ``train_prompts`` `(P,)`, and per metric the stacked
        `(N, D, R, T, P[, k])` arrays.
    """
    envs = environments(cfg.env)
    rows = all_rows(cfg)
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r.label, tuple(sorted(r.static.items()))), []).append(i)
    entries = {m.label: m for m in cfg.methods}
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in METRICS}
    order: list[int] = []
    bar = progress_bar(len(groups), "toy sweep", "program", progress=progress)
    for (label, _), index in groups.items():
        bar.set_postfix_str(f"{label} ({len(index)} setting{'' if len(index) == 1 else 's'})")
        out = run_program(cfg, envs, entries[label], [rows[i] for i in index])
        for k in METRICS:
            arrays[k].append(out[k])
        order.extend(index)
        bar.update()
    bar.close()
    return {
        "rows": [rows[i] for i in order],
        "row_order": np.array(order),
        "train_prompts": envs[0].train_prompts.copy(),
        **{k: np.concatenate(v) for k, v in arrays.items()},
    }


def read_steps(cfg: SweepConfig, label: str, paths: bool = True) -> tuple[int, ...]:
    """The updates at which the lift analysis reads the rows of `label` (step 0, the base, aside):
    every checkpoint (each run a path: a method is early-stopped as GRPO is), or with
    `paths=False` (figure 6's reading) the last alone for a row outside the reference."""
    steps = cfg.eval_steps[1:]
    return steps if paths or label in cfg.reference else steps[-1:]


TUNING_KEYS = ("lr", "kl_coef")
"""A setting's keys that tune it rather than shape it (`budgets`)."""


def budgets(cfg: SweepConfig) -> list[spec.Budget]:
    """Each row's tuning (`experiment.spec.Budget`, for a study's equal-budget check): its
    learning rate and ``kl_coef`` (the row's value, else its entry's ``fixed``, else
    ``[train]``'s) and the updates its models are read at (`read_steps`)."""
    fixed = {m.label: m.fixed for m in cfg.methods}
    out = []
    for r in all_rows(cfg):
        kl = r.values.get("kl_coef", fixed[r.label].get("kl_coef", cfg.train.kl_coef))
        own = {k: v for k, v in r.values.items() if k not in TUNING_KEYS}
        axes = {"lr": float(r.values.get("lr", cfg.train.lr)), "kl_coef": float(kl),
                "checkpoints": read_steps(cfg, r.label)}  # fmt: skip
        out.append(spec.Budget(r.label, Run(r.label, r.method, own, {}).setting(), axes))
    return out


def frontier_data(
    cfg: SweepConfig, res: Mapping[str, Any], metric: str, paths: bool = True
) -> dict[str, Any]:
    """Per-problem gains over the base policy (step 0) in `experiment.frontier`'s layout: seeds =
    training seeds; problems = the dataset draws, each the mean over its held-out prompts (the
    training prompts when nothing is held out), or the prompts themselves with one draw, so that
    the problem axis is crossed with the seeds (a run's effect is then the seed × draw cell, not
    shared by many "problems"); models = every row at each of its `read_steps`.

    Args:
        metric: ``"pass_at_k"`` (at the largest k) or ``"distinct_correct"``.
        paths: `read_steps`' choice: every checkpoint of every row (True) or, outside the
            reference, the last alone.

    Returns:
        ``x``, ``y`` `(M, R, D)` (or `(M, R, P')` with one draw) gains, ``models``, ``rows`` (one record per model), ``row``
        `(M,)` the sweep row of each model, ``base_x``, ``base_y`` the base means.
    """
    train = np.asarray(res["train_prompts"])
    sel = ~train if (~train).any() else train
    corr = res["correctness"][..., sel]  # (N, D, R, T, P')
    div = res[metric][..., sel, -1] if metric == "pass_at_k" else res[metric][..., sel]

    def per_problem(a: np.ndarray) -> np.ndarray:  # (N, D, R, T, P') -> (N, T, R, D or P')
        if a.shape[1] > 1:  # a draw's prompts share its runs: the draw is the problem unit
            a = a.mean(axis=-1, keepdims=True)
        n, d, r, t, p = a.shape
        return a.transpose(0, 3, 2, 1, 4).reshape(n, t, r, d * p)

    cx, dy = per_problem(corr), per_problem(div)
    bx, by = cx[0, 0], dy[0, 0]  # step 0: the base policy, the same for every row
    rows: list[Run] = res["rows"]
    steps = cfg.eval_steps
    picks = [
        (i, steps.index(s))
        for i, r in enumerate(rows)
        # a reference row's path starts at the base policy (step 0)
        for s in ((0,) if r.label in cfg.reference else ()) + read_steps(cfg, r.label, paths)
    ]
    records = [{"label": rows[i].label, "params": rows[i].values, "setting": rows[i].setting(),
                "step": int(steps[t])} for i, t in picks]  # fmt: skip
    models = frontier.Models(*([r[k] for r in records] for k in ("label", "setting", "step")))
    x = np.stack([cx[i, t] - bx for i, t in picks]).astype(np.float64)
    y = np.stack([dy[i, t] - by for i, t in picks]).astype(np.float64)
    return {"x": x, "y": y, "models": models, "rows": records,
            "row": np.array([i for i, _ in picks]), "base_x": float(bx.mean()),
            "base_y": float(by.mean())}  # fmt: skip


def analyse(cfg: SweepConfig, res: Mapping[str, Any], paths: bool = True) -> dict[str, Any]:
    """Per measure of `experiment.report.MEASURES`: ``data`` (`frontier_data` with `paths`),
    ``lift`` (the `LiftResult`) and ``section`` (results.json's record,
    `experiment.report.lift_analysis`)."""
    out = {}
    for metric in report.MEASURES:
        data = frontier_data(cfg, res, metric, paths)
        k = max(cfg.train.pass_k) if metric == "pass_at_k" else None
        section, lift = report.lift_analysis(
            data["x"], data["y"], data["models"], data["rows"], cfg.reference, k=k,
            num_resamples=cfg.num_resamples, seed=cfg.train.seed,
        )  # fmt: skip
        out[metric] = {"data": data, "lift": lift, "section": section}
    return out


def results_doc(cfg: SweepConfig, res: Mapping[str, Any], analysis: Mapping[str, Any]) -> dict:
    """The JSON document of `results.json` (module docstring)."""
    train = np.asarray(res["train_prompts"])
    splits = [("train", train)] + ([("heldout", ~train)] if (~train).any() else [])
    runs = []
    for i, row in enumerate(res["rows"]):
        metrics = {}
        for split, sel in splits:
            for k in METRICS:
                a = res[k][i]  # (D, R, T, P[, k])
                axis = -2 if k == "pass_at_k" else -1
                mean = np.compress(sel, a, axis=axis).mean(axis=axis)
                metrics[f"{split}/{k}"] = np.round(mean.astype(np.float64), 6).tolist()
        runs.append({"label": row.label, "method": row.method, "setting": row.setting(),
                     "values": row.values, "metrics": metrics})  # fmt: skip
    header = report.results_header(
        "toy", numerics_tag=numerics.tag(), config=cfg.doc,
        methods={m.label: m.method for m in cfg.methods}, reference=cfg.reference,
        seeds=cfg.seeds, checkpoints=cfg.eval_steps[1:],
    )  # fmt: skip
    return {
        **header,
        "axes": {
            "draws": list(cfg.env.draws),
            "seeds": list(cfg.seeds),
            "eval_steps": list(cfg.eval_steps),
            "pass_k": list(cfg.train.pass_k),
            "layout": "metrics[split/name]: (draws, seeds, eval_steps[, pass_k]), prompt means",
        },
        "runs": runs,
        "frontier": {metric: item["section"] for metric, item in analysis.items()},
    }


def _columns(cfg: SweepConfig) -> str:
    """What the problem axis of the lift analysis is (`frontier_data`)."""
    if len(cfg.env.draws) > 1:
        return "the dataset draws (each the mean over its held-out prompts)"
    return "the prompts"


def _design(cfg: SweepConfig) -> str:
    split = "held-out" if cfg.env.kind == "dataset" else "training"
    return (f"{split} prompts of {len(cfg.env.draws)} draw(s), seeds {list(cfg.seeds)}, "
            f"{cfg.train.optimizer} lr {cfg.train.lr:g}, G = {cfg.train.group_size}, "
            f"U = {cfg.train.updates}")  # fmt: skip


def sweep(
    config_path: Path,
    out: Path | None = None,
    *,
    use_cache: bool = True,
    progress: bool = True,
    sets: Iterable[str] = (),
) -> dict[str, Any]:
    """Run (or load from the cache) a sweep, then write `results.json`, `frontier.png`, `lifts.md`;
    `sets`: ``KEY=VALUE`` overrides of the file (`toymdp.sweep_spec.load_config`; results.json's
    ``config`` is the document they give).

    Returns:
        ``{"out": Path, "cached": bool, "run_s": float, "doc": results.json's dict}``.

    Raises:
        ValueError: naming the file and key (or the ``--set`` pair) of a bad configuration.
        experiment.lock.RunFolderError: another live sweep or study holds `out` (its PID named).
    """
    cfg = load_config(config_path, sets)
    out = Path(out) if out is not None else Path("runs/toy_sweep") / Path(config_path).stem
    return sweep_config(cfg, out, use_cache=use_cache, progress=progress)


def sweep_config(
    cfg: SweepConfig, out: Path, *, use_cache: bool = True, progress: bool = True
) -> dict[str, Any]:
    """`sweep` of a parsed configuration into the folder `out` (returns `sweep`'s mapping plus
    ``analysis``, the `analyse` of the results), under `out`'s lock (`experiment.lock.RunLock`:
    one sweep or study per folder). A folder `out` that this call creates is removed if it fails
    (its compilation cache included): a failed command leaves nothing.

    Raises:
        experiment.lock.RunFolderError: another live sweep or study holds `out` (its PID named).
    """
    out = Path(out)
    created = not out.exists()
    with RunLock(out):
        try:
            return _sweep_into(cfg, out, use_cache=use_cache, progress=progress)
        except BaseException:
            if created:
                shutil.rmtree(out, ignore_errors=True)
            raise


def cache_file(cfg: SweepConfig, out: Path) -> Path:
    """Where `run_cached` keeps `cfg`'s results: ``out/.cache/sweep-<code hash>-<config
    hash>.npz``, the code hash over the sources that compute the runs (`toymdp.engine.RUN_SOURCES`)
    and, for a sweep of methods defined outside the package (``--import``), ``-<digest>`` of their
    code (`shaping.method_code`) before the suffix: an edited method trains again."""
    user = shaping.method_code(m.method for m in cfg.methods)
    mine = "-" + hashlib.sha256(json.dumps(user).encode()).hexdigest()[:12] if user else ""
    return out / ".cache" / f"sweep-{code_hash(RUN_SOURCES)}-{cfg.digest()}{mine}.npz"


def run_cached(
    cfg: SweepConfig, out: Path, *, use_cache: bool = True, progress: bool = True
) -> tuple[dict[str, Any], bool]:
    """`run_sweep` of `cfg`, cached in `cache_file` (with XLA's compilation cache beside it);
    returns the results and whether they came from the cache."""
    cache = out / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    path = cache_file(cfg, out)
    cached = use_cache and path.exists()
    if cached:
        with np.load(path) as data:
            res: dict[str, Any] = {k: data[k] for k in data.files}
        rows = all_rows(cfg)
        res["rows"] = [rows[int(i)] for i in res["row_order"]]
    else:
        with jax_cache(cache / "jax"):
            res = run_sweep(cfg, progress=progress)
        store.save_npz(path, {k: v for k, v in res.items() if k != "rows"})
    return res, cached


def _sweep_into(cfg: SweepConfig, out: Path, *, use_cache: bool, progress: bool) -> dict[str, Any]:
    start = time.perf_counter()
    res, cached = run_cached(cfg, out, use_cache=use_cache, progress=progress)
    run_s = time.perf_counter() - start
    analysis = analyse(cfg, res)
    doc = results_doc(cfg, res, analysis)
    store.write_json(out / "results.json", doc, indent=1)
    intro = (f"Lift at matched pass@1 over `{', '.join(cfg.reference)}` (every checkpoint of every "
             f"setting), gains over the base policy on the {_design(cfg)}; {report.LIFT_METHOD}; "
             f"problems: {_columns(cfg)}; {report.LIFT_STATUS} ({cfg.num_resamples} draws).")  # fmt: skip
    labels, title = [m.label for m in cfg.methods], f"frontiers: {_design(cfg)}"
    store.write_text(out / "lifts.md", report.lift_markdown(doc["frontier"], intro))
    report.plot_frontier(doc["frontier"], out / "frontier.png", labels=labels,
                         reference=cfg.reference, title=title)  # fmt: skip
    inputs = {metric: {**{k: item["data"][k] for k in ("x", "y", "models", "rows")},
                       "reference": list(cfg.reference),
                       "k": max(cfg.train.pass_k) if metric == "pass_at_k" else None}
              for metric, item in analysis.items()}  # fmt: skip
    reread.save_inputs(out / reread.INPUTS, inputs, num_resamples=cfg.num_resamples,
                       seed=cfg.train.seed, intro=intro, labels=labels, title=title)  # fmt: skip
    return {"out": out, "cached": cached, "run_s": run_s, "doc": doc, "analysis": analysis}
