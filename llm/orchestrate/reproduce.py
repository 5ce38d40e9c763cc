"""The CPU LLM stage of `make reproduce`: ``python -m llm reproduce``, a budgeted sweep.

1. build (or reuse) the offline tiny base model (`llm.model.tiny.ensure_base_model`);
2. run the sweep ``configs/sweep_countdown_tiny.toml`` (`llm.orchestrate.sweep`) from it: GRPO's
   training path and a ``kl_coef`` setting as the reference curve, DS-GRPO, entropy bonus, CaSP
   and unlikeliness at three coefficients each from no effect to collapse, three seeds, every run
   evaluated at three checkpoints on the same held-out problems with the same sampling seed
   (paired), in ``RUNS/sweep/`` (``results.json``: per-problem correct counts of every model);
3. write ``FIGURES/llm_countdown_frontier.png`` (pass@1 gain vs pass@k gain at the largest k and
   vs distinct correct gain, per method, GRPO's hull as the reference, t intervals),
   ``FIGURES/llm_countdown_lifts.md`` (lift at matched pass@1 over GRPO's hull with 95% CIs,
   `experiment.inference`), ``FIGURES/llm_countdown_passk.png`` (pass@k vs k at the last checkpoint,
   and minus the base model's, as seed 000 §4.5 plots it), ``FIGURES/llm_countdown_results.md``
   (the results table and the lift tables) and ``FIGURES/llm_countdown.json`` (the same
   numbers, per seed, with the settings, lifts and timings).

Resume-safe (`llm.orchestrate.sweep`): a finished run is reused when its resolved config and the
base model's weights match, an unfinished one resumes from its newest checkpoint, a stale one is
retrained; an evaluation is reused when its settings match.

Deterministic given the seeds: every run uses ONE torch thread. The tiny model's matrices are too
small for a second thread to help (measured: 0.125 s per step with one thread or two), one
thread makes the float rounding independent of ``--jobs``, and it lets ``--jobs 2`` train two runs
side by side on a 2-core machine at twice the throughput.

``--quick`` is the smoke-test budget: a 1-layer base model warm-started for a few steps, the first
seed only, 2 training steps per run evaluated at steps 1 and 2, 4 held-out problems x 4 samples,
in ``RUNS/quick/`` (figures there too unless ``--figures`` is given), so it never overwrites the
real runs or the committed figures.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

import numerics
import shaping
from experiment.store import write_json
from llm.eval.frontier import setting_name, write_reports
from llm.model.tiny import TinyConfig, ensure_base_model
from llm.orchestrate.sweep import run_sweep
from llm.orchestrate.sweep_spec import SweepSpec, sweep_from_dict

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_METHODS",
    "DEFAULT_SWEEP",
    "QUICK_TINY",
    "ReproduceSettings",
    "format_summary",
    "parse_seeds",
    "reproduce",
    "results_table",
]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "configs" / "countdown_tiny.toml"
DEFAULT_SWEEP = ROOT / "configs" / "sweep_countdown_tiny.toml"
DEFAULT_METHODS: tuple[str, ...] = ("grpo", "ds_grpo", "entropy_bonus", "casp", "unlikeliness")


def _quick_tiny() -> Any:
    # Same problem distribution (so the same held-out problems), a model that builds in seconds.
    return TinyConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_train_problems=32,
        epochs=1,
        batch_size=32,
    )


QUICK_TINY = "a 1-layer, 32-wide model warm-started for a few steps on 32 problems"


@dataclass
class ReproduceSettings:
    """What `reproduce` runs; the defaults are the `make reproduce` budget (2-core CPU)."""

    out_runs: str = "runs"
    """folder of the base model and the sweep (RUNS/sweep/)"""
    figures: str | None = None
    """folder of the figures, tables and json (None: figures/, or RUNS/quick/figures with quick)"""
    config: str = str(DEFAULT_CONFIG)
    """train config every run starts from (the sweep's ``base``)"""
    sweep: str = str(DEFAULT_SWEEP)
    """the sweep: methods, coefficient grids, seeds, checkpoints, evaluation"""
    methods: tuple[str, ...] = DEFAULT_METHODS
    """shaping methods of the sweep to run (the reference is always run)"""
    seeds: tuple[int, ...] | None = None
    """training seeds (None: the sweep's)"""
    steps: int | None = None
    """training steps (None: the sweep's)"""
    eval_problems: int | None = None
    """held-out problems (None: the sweep's)"""
    eval_samples: int | None = None
    """samples per problem n (None: the sweep's)"""
    eval_seed: int | None = None
    """sampling seed of the evaluation, the same for every model (None: the sweep's)"""
    jobs: int = 2
    """runs trained and evaluated side by side (processes, one torch thread each)"""
    semantic: bool = False
    """also compute the MiniLM cosine among correct answers (needs the dsdr extra; slower)"""
    quick: bool = False
    """smoke-test budget (see the module docstring)"""
    progress: bool = True
    """tqdm bars"""
    num_resamples: int = 1000
    """draws of the means behind the lift CIs (`experiment.inference`)"""
    engine: str = "batched"
    """how the sweep trains its runs (`llm.orchestrate.sweep.run_sweep`): batched (runs that share a
    batch train as one program, `llm.train.batched`) or process (each run alone)"""

    def resolved(self) -> ReproduceSettings:
        """Apply `quick`: the first seed only, 2 steps, 4 problems x 4 samples, one process,
        folders under RUNS/quick/."""
        if not self.quick:
            figures = self.figures if self.figures is not None else "figures"
            return replace(self, figures=figures)
        runs = str(Path(self.out_runs) / "quick")
        figures = self.figures if self.figures is not None else str(Path(runs) / "figures")
        seeds = self.seeds[:1] if self.seeds else (0,)
        return replace(
            self,
            out_runs=runs,
            figures=figures,
            seeds=seeds,
            steps=2 if self.steps is None else self.steps,
            eval_problems=min(self.eval_problems or 4, 4),
            eval_samples=min(self.eval_samples or 4, 4),
            jobs=1,
            num_resamples=min(self.num_resamples, 100),
        )


def _spec(s: ReproduceSettings, base_dir: Path) -> SweepSpec:
    """The sweep file with the settings' overrides: base config and model, methods, seeds,
    steps (checkpoints: thirds of the steps), evaluation sizes."""

    unknown = [m for m in s.methods if m not in shaping.METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; known: {sorted(shaping.METHODS)}")
    with Path(s.sweep).open("rb") as f:
        doc = tomllib.load(f)
    doc["base"] = str(Path(s.config).resolve())
    train = doc.setdefault("train", {})
    train.update({"model_path": str(base_dir), "build_base_model": False})
    if s.steps is not None:
        train["steps"] = s.steps
        doc["checkpoints"] = min(3, s.steps)
    ref = doc.get("reference", [doc["methods"][0].get("label", doc["methods"][0]["method"])])
    ref = [ref] if isinstance(ref, str) else ref
    doc["methods"] = [
        m for m in doc["methods"] if m["method"] in s.methods or m.get("label", m["method"]) in ref
    ]
    if s.seeds is not None:
        doc["seeds"] = list(s.seeds)
    ev = doc.setdefault("eval", {})
    for key, value in (("problems", s.eval_problems), ("samples", s.eval_samples),
                       ("seed", s.eval_seed)):  # fmt: skip
        if value is not None:
            ev[key] = value
    if "ks" in ev and s.eval_samples is not None:
        ev["ks"] = [k for k in ev["ks"] if k <= s.eval_samples]
    ev["semantic"] = s.semantic or ev.get("semantic", False)
    spec = sweep_from_dict(doc, root=Path(s.sweep).resolve().parent)
    spec.source = _rel(s.sweep)
    return spec


def _rel(path: str | os.PathLike[str]) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


# ---------------------------------------------------------------------------------------------
# Summary, table and figure


def _stat(values: Sequence[float | None]) -> dict[str, float] | None:
    """Mean and half range over seeds (None when no value)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"mean": float(np.mean(vals)), "spread": float((max(vals) - min(vals)) / 2)}


def _summary(results: Mapping[str, Any]) -> dict[str, Any]:
    """Per setting (label and parameters), the last checkpoint's numbers over seeds."""
    s = results["settings"]
    last = s["checkpoints"][-1]
    runs = {r["run"]: r for r in results["runs"]}
    per_seed: dict[str, list[dict[str, Any]]] = {}
    for m in results["models"]:
        if m["step"] != last:
            continue
        key = f"{m['label']}[{setting_name(m['params'])}]"
        per_seed.setdefault(key, []).append(
            {
                "seed": m["seed"],
                "label": m["label"],
                "method": m["method"],
                "hyper": m["params"],
                "step": m["step"],
                "pass_at_k": m["pass_at_k"],
                "distinct_correct": m["distinct_correct"],
                "self_bleu": m["self_bleu"],
                "accuracy": m["accuracy"],
                "semantic_cosine_correct": m.get("semantic_cosine_correct"),
                "train_seconds": runs[m["run"]]["train_seconds"],
                "train_reward_first": runs[m["run"]]["train_reward_first"],
                "train_reward_last": runs[m["run"]]["train_reward_last"],
                "eval_seconds": m["eval_seconds"],
            }
        )
    base = next(m for m in results["models"] if m["label"] == "base")

    def one(v: float | None) -> dict[str, float] | None:
        return None if v is None else {"mean": float(v), "spread": 0.0}

    base_entry = {
        "seeds": [],
        "hyper": {},
        "pass_at_k": {k: one(v) for k, v in base["pass_at_k"].items()},
        "distinct_correct": one(base["distinct_correct"]),
        "self_bleu": one(base["self_bleu"]),
        "accuracy": one(base["accuracy"]),
        "train_seconds": None,
    }
    methods: dict[str, Any] = {"base": base_entry}
    for key, rows in per_seed.items():
        methods[key] = {
            "label": rows[0]["label"],
            "method": rows[0]["method"],
            "seeds": [r["seed"] for r in rows],
            "hyper": rows[0]["hyper"],
            "pass_at_k": {k: _stat([r["pass_at_k"][k] for r in rows]) for k in base["pass_at_k"]},
            "distinct_correct": _stat([r["distinct_correct"] for r in rows]),
            "self_bleu": _stat([r["self_bleu"] for r in rows]),
            "accuracy": _stat([r["accuracy"] for r in rows]),
            "train_seconds": _stat([r["train_seconds"] for r in rows]),
            "train_reward_first": _stat([r["train_reward_first"] for r in rows]),
            "train_reward_last": _stat([r["train_reward_last"] for r in rows]),
        }
    for agg in methods.values():
        agg["pass_at_k_minus_base"] = {
            k: (v["mean"] - base["pass_at_k"][k]) if v else None
            for k, v in agg["pass_at_k"].items()
        }
    return {"base": base_entry, "methods": methods, "per_seed": per_seed}


def _fmt(s: dict[str, float] | None, digits: int = 3, spread: bool = True) -> str:
    if s is None:
        return "-"
    text = f"{s['mean']:.{digits}f}"
    if spread:
        text += f" ± {s['spread']:.{digits}f}"
    return text


def results_table(summary: Mapping[str, Any]) -> str:
    """The Markdown results table of a `figures/llm_countdown.json` mapping: one row per method
    setting at the last checkpoint, mean over seeds ± half their range."""
    ks = list(summary["base"]["pass_at_k"])
    shown = [k for k in ks if k in ("1", "4") or k == ks[-1]]
    head = ["method", "setting", *(f"pass@{k}" for k in shown)]
    head += ["distinct correct / problem", "Self-BLEU", "train reward first→last 10%"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, agg in summary["methods"].items():
        many = len(agg["seeds"]) > 1  # show the spread over seeds, even when it is 0
        label = agg.get("label", key)
        row = [label, "-" if key == "base" else setting_name(agg["hyper"])]
        row += [_fmt(agg["pass_at_k"][k], spread=many) for k in shown]
        row += [_fmt(agg["distinct_correct"], 2, many), _fmt(agg["self_bleu"], spread=many)]
        first, last = agg.get("train_reward_first"), agg.get("train_reward_last")
        row.append(f"{first['mean']:.3f} → {last['mean']:.3f}" if first and last else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot_summary(summary: Mapping[str, Any], settings: Mapping[str, Any], path: Any) -> None:
    """pass@k vs k (left) and pass@k minus the base model's (right) at the last checkpoint, one
    colour per method, lighter for weaker coefficients (bars: range over seeds)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    base = summary["base"]["pass_at_k"]
    ks = [int(k) for k in base]
    base_v = np.array([base[k]["mean"] for k in base])
    ax1.plot(ks, base_v, "k--", marker="o", label="base")
    ax2.axhline(0.0, color="k", ls="--", lw=1, label="base")
    labels = list(dict.fromkeys(a["label"] for k, a in summary["methods"].items() if k != "base"))
    for i, label in enumerate(labels):
        keys = [k for k, a in summary["methods"].items() if k != "base" and a["label"] == label]
        for j, key in enumerate(keys):
            agg = summary["methods"][key]
            mean = np.array([agg["pass_at_k"][k]["mean"] for k in base])
            spread = np.array([agg["pass_at_k"][k]["spread"] for k in base])
            style = {"color": f"C{i}", "alpha": 0.35 + 0.65 * (j + 1) / len(keys), "ms": 3}
            ax1.plot(ks, mean, marker="o", **style)
            ax2.errorbar(
                ks, mean - base_v, yerr=spread if spread.any() else None, marker="o", capsize=2,
                label=f"{label} {setting_name(agg['hyper'])}", **style,
            )  # fmt: skip
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("pass@k")
    ax1.set_ylim(0, 1)
    ax1.set_title("held-out Countdown, tiny model, last checkpoint")
    ax2.set_ylabel("pass@k − base pass@k")
    ax2.set_title("gain over the base model (bars: range over seeds)")
    ax2.legend(fontsize=6, ncol=2)
    ev = settings["eval"]
    fig.suptitle(
        f"{ev['problems']} held-out problems × {ev['samples']} samples; "
        f"{settings['steps']} steps, lr {settings['lr']:g}, seeds {settings['seeds']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The stage


def reproduce(settings: ReproduceSettings) -> dict[str, Any]:
    """Run the stage described in the module docstring; returns the summary json mapping.

    Raises:
        ValueError: an unknown method, or an invalid config or sweep (naming the key).
    """

    s = settings.resolved()
    assert s.figures is not None
    runs, figures = Path(s.out_runs), Path(s.figures)
    runs.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    phases: dict[str, float] = {}

    # 1. The base model.
    tiny = _quick_tiny() if s.quick else TinyConfig()
    base_dir = runs / ("base_tiny_quick" if s.quick else "base_tiny")
    t0 = time.perf_counter()
    ensure_base_model(base_dir, config=tiny, num_threads=2, progress=s.progress)
    phases["base_model"] = time.perf_counter() - t0

    # 2. The sweep.
    spec = _spec(s, base_dir)
    results = run_sweep(
        spec, runs / "sweep", workers=s.jobs, progress=s.progress, num_resamples=s.num_resamples,
        engine=s.engine,
    )  # fmt: skip
    phases["train_and_eval"] = results["timings_seconds"]["runs"]
    phases["frontier"] = results["timings_seconds"]["frontier"]

    # 3. Summary, tables, figures.
    t0 = time.perf_counter()
    summary = _summary(results)
    rs = results["settings"]
    plot_summary(summary, rs, figures / "llm_countdown_passk.png")
    lifts = write_reports(
        results, figures / "llm_countdown_frontier.png", figures / "llm_countdown_lifts.md"
    )
    phases["figures"] = time.perf_counter() - t0
    phases["total"] = time.perf_counter() - t_start
    out: dict[str, Any] = {
        "settings": {
            "config": _rel(s.config),
            "sweep": spec.source,
            "methods": spec.labels,
            "seeds": rs["seeds"],
            "steps": rs["steps"],
            "checkpoints": rs["checkpoints"],
            "lr": rs["lr"],
            "group_size": rs["group_size"],
            "prompts_per_step": rs["prompts_per_step"],
            "quick": s.quick,
            "numerics": numerics.tag(),
            "base_model": asdict(tiny),
            "eval_problems": rs["eval"]["problems"],
            "eval_samples": rs["eval"]["samples"],
            "eval_seed": rs["eval"]["seed"],
            "eval_source": rs["eval"]["source"],
            "eval_temperature": rs["eval"]["temperature"],
            "semantic": rs["eval"]["semantic"],
            "reference": ", ".join(rs["reference"]),
        },
        **summary,
        "frontier": results["frontier"],
        "results": _rel(runs / "sweep" / "results.json"),
        "timings_seconds": {k: round(v, 1) for k, v in phases.items()},
        "reused": results["reused"],
    }
    tracked, timings = _split_timings(out)
    write_json(figures / "llm_countdown.json", tracked)
    (figures / "llm_countdown_results.md").write_text(_markdown(out, lifts), encoding="utf-8")
    # Wall-clock times differ on every invocation: kept out of the committed files, so a rerun
    # leaves `git status` clean.
    (figures / ".cache").mkdir(parents=True, exist_ok=True)
    write_json(figures / ".cache" / "llm_countdown_timings.json", timings)
    return out


_TIMING_KEYS = ("train_seconds", "eval_seconds")


def _split_timings(out: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`out` without its wall-clock fields, and those fields (invocation timings, reuse counts,
    each run's training and evaluation seconds)."""
    tracked = json.loads(json.dumps(out))
    timings: dict[str, Any] = {
        "timings_seconds": tracked.pop("timings_seconds", None),
        "reused": tracked.pop("reused", None),
        "methods": {},
        "per_seed": {},
    }
    for k in _TIMING_KEYS:
        tracked.get("base", {}).pop(k, None)
    for key, agg in tracked.get("methods", {}).items():
        timings["methods"][key] = {k: agg.pop(k, None) for k in _TIMING_KEYS if k in agg}
    for key, rows in tracked.get("per_seed", {}).items():
        timings["per_seed"][key] = [
            {k: r.pop(k, None) for k in _TIMING_KEYS if k in r} for r in rows
        ]
    return tracked, timings


def _markdown(summary: Mapping[str, Any], lifts: str) -> str:
    s = summary["settings"]
    spread = " (mean over seeds ± half their range)" if len(s["seeds"]) > 1 else ""
    return (
        "# Countdown on the offline tiny model: GRPO's frontier and the shaping methods\n\n"
        f"Written by `python -m llm reproduce{' --quick' if s['quick'] else ''}` from the sweep "
        f"`{s['sweep']}` on config `{s['config']}`: {s['steps']} steps of "
        f"{s['prompts_per_step']} prompts × {s['group_size']} samples, lr {s['lr']:g}, seeds "
        f"{s['seeds']}, every run evaluated at steps {s['checkpoints']}. Evaluation: the first "
        f"{s['eval_problems']} problems of llm.tiny's held-out stream, {s['eval_samples']} samples "
        f"each at temperature {s['eval_temperature']:g}, sampling seed {s['eval_seed']} for every "
        "model (paired); unbiased pass@k; distinct correct = distinct correct solutions per "
        "problem (up to commutativity); Self-BLEU in [0, 1], lower = more diverse. Train reward: "
        "mean reward of the first and last 10% of training steps.\n\n"
        f"## Last checkpoint{spread}\n\n{results_table(summary)}\n\n"
        f"## Lift at matched pass@1 over GRPO's curve\n\n{lifts}\n"
        "Wall-clock timings of the invocation that wrote this file are in "
        "`figures/.cache/llm_countdown_timings.json` (untracked).\n"
    )


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary printed at the end of ``python -m llm reproduce``."""
    t = summary["timings_seconds"]
    phases = ", ".join(f"{k} {v:.0f} s" for k, v in t.items())
    return f"{results_table(summary)}\n\nphases: {phases}"


def parse_seeds(values: Sequence[str]) -> tuple[int, ...]:
    """Seeds from the command line (integers >= 0)."""
    seeds = tuple(int(v) for v in values)
    if any(v < 0 for v in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: expected distinct integers >= 0, got {list(values)}")
    return seeds
