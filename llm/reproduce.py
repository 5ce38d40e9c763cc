"""The CPU LLM stage of `make reproduce`: ``python -m llm reproduce``.

1. build (or reuse) the offline tiny base model (`llm.tiny.ensure_base_model`);
2. train every requested method from it with the CPU default config
   (``configs/countdown_tiny.toml``, method and hyper-parameters overridden, see `METHOD_HYPER`),
   one run per (method, seed) in ``RUNS/countdown_<method>/`` (seed 0) or
   ``RUNS/countdown_<method>_seed<s>/``;
3. evaluate the base model and every trained model on the same held-out problems (llm.tiny's
   held-out stream, same sampling seed): unbiased pass@k for k = 1, 2, 4, ..., n, distinct correct
   solutions per problem and Self-BLEU, merged into ``RUNS/eval/eval.json`` by `llm.eval.write_eval`;
4. write ``FIGURES/llm_countdown_passk.png`` (pass@k vs k, and pass@k minus the base model's, as
   seed 000 §4.5 plots it), ``FIGURES/llm_countdown_results.md`` (the results table) and
   ``FIGURES/llm_countdown.json`` (the same numbers, per seed, with the settings and timings).

Resume-safe: a finished run is reused when its resolved config and the base model's weights match
(``RUNS/countdown_*/reproduce_run.json`` records the base weights' hash), an unfinished one resumes
from its newest checkpoint, a stale one is deleted and retrained; an eval.json entry is reused when
the evaluated weights and the evaluation settings match. Finished runs keep only their last
checkpoint (each holds the optimizer state; ten runs x eight checkpoints would be ~1 GB).

Deterministic given the seeds: every run uses ONE torch thread. The tiny model's matrices are too
small for a second thread to help (measured: 0.125 s per step with one thread or two), one
thread makes the float rounding independent of ``--jobs``, and it lets ``--jobs 2`` train two runs
side by side on a 2-core machine at twice the throughput.

``--quick`` is the smoke-test budget: a 1-layer base model warm-started for a few steps, the first
seed only, 2 training steps per method, 4 held-out problems x 4 samples, in ``RUNS/quick/`` (figures there too unless
``--figures`` is given), so it never overwrites the real runs or the committed figures.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_METHODS",
    "METHOD_HYPER",
    "QUICK_TINY",
    "ReproduceSettings",
    "reproduce",
    "results_table",
]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "countdown_tiny.toml"
DEFAULT_METHODS: tuple[str, ...] = ("grpo", "ds_grpo", "entropy_bonus", "casp", "unlikeliness")
RUN_MARKER = "reproduce_run.json"

# Hyper-parameters for this scale (methods not listed take `shaping.METHODS[m].defaults`).
#
# DS-GRPO shapes the advantage with l = log pi_old(tau), summed over the response's tokens:
# A - gamma_p l on correct responses, A + gamma_n l on incorrect ones, next to a group-normalized
# GRPO advantage of order 1. Seed 000's gamma_p = 0.01..0.03, gamma_n = 0.002..0.01 multiply sums
# over hundreds of tokens (|l| of tens of nats), i.e. a shaping term of order 0.3-1. Here responses
# are ~9 tokens: on the base model |l| is 1.8 nats at the median correct response (5-95%:
# 0.9-3.3) and 3.5 at the median incorrect one (1.4-9.8), so the paper's values would shape by
# ~0.04, nothing. gamma_p = 0.3, gamma_n = 0.05 restore the paper's relative size (0.55 at the
# median correct, 0.17 at the median incorrect) and keep its gamma_p / gamma_n ratio of 4-6.
# Measured at 400 steps, seed 0 (pass@1 / pass@32 / distinct correct on 128 x 32 held-out
# samples; GRPO 0.383 / 0.805 / 1.91): (0.3, 0.05) 0.394 / 0.820 / 2.17, (0.5, 0.1)
# 0.388 / 0.789 / 1.88, (1.0, 0.1) 0.376 / 0.805 / 2.23: no setting is clearly better, the
# differences are of the size of the seed-to-seed spread (GRPO seed 1: 0.406 / 0.789 / 1.81).
# The entropy bonus subtracts eta l from every response: eta = 0.1 is the same scale argument
# (0.2-0.35 at the median response). CaSP's alpha mixes the candidates' ratios into the
# positive-advantage ratio; its paper default 0.01 changes nothing at this scale, 0.5 is a
# strong setting in between. Unlikeliness ranks responses within a group, which is scale-free:
# its default is kept.
METHOD_HYPER: dict[str, dict[str, Any]] = {
    "ds_grpo": {"gamma_p": 0.3, "gamma_n": 0.05},
    "ds_grpo_pos": {"gamma_p": 0.3},
    "ds_grpo_neg": {"gamma_n": 0.05},
    "entropy_bonus": {"eta": 0.1},
    "entropy_penalty": {"eta": 0.1},
    "casp": {"alpha": 0.5},
}


def _quick_tiny() -> Any:
    from llm.tiny import TinyConfig

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
    """folder of the base model, the runs and eval/"""
    figures: str | None = None
    """folder of the figure, table and json (None: figures/, or RUNS/quick/figures with quick)"""
    config: str = str(DEFAULT_CONFIG)
    """train config every run starts from (method, hyper, seed, model_path overridden)"""
    methods: tuple[str, ...] = DEFAULT_METHODS
    """shaping methods to train"""
    seeds: tuple[int, ...] = (0, 1)
    """training seeds (one run per method and seed; the table shows their mean)"""
    steps: int | None = None
    """training steps (None: the config's)"""
    eval_problems: int = 128
    """held-out problems (llm.tiny's held-out stream)"""
    eval_samples: int = 32
    """samples per problem n (pass@k for k = 1, 2, 4, ..., n)"""
    eval_seed: int = 0
    """sampling seed of the evaluation (the same for every model: paired comparisons)"""
    jobs: int = 2
    """runs trained and evaluated side by side (processes, one torch thread each)"""
    semantic: bool = False
    """also compute the MiniLM cosine among correct answers (needs the dsdr extra; slower)"""
    quick: bool = False
    """smoke-test budget (see the module docstring)"""
    progress: bool = True
    """tqdm bars"""
    hyper: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(METHOD_HYPER))
    """per-method hyper-parameter overrides"""

    def resolved(self) -> ReproduceSettings:
        """Apply `quick`: the first seed only, 2 steps, 4 problems x 4 samples, one process,
        folders under RUNS/quick/."""
        if not self.quick:
            figures = self.figures if self.figures is not None else "figures"
            return replace(self, figures=figures)
        runs = str(Path(self.out_runs) / "quick")
        figures = self.figures if self.figures is not None else str(Path(runs) / "figures")
        return replace(
            self,
            out_runs=runs,
            figures=figures,
            seeds=self.seeds[:1],
            steps=2 if self.steps is None else self.steps,
            eval_problems=min(self.eval_problems, 4),
            eval_samples=min(self.eval_samples, 4),
            jobs=1,
        )


@dataclass
class _Job:
    """One unit of work for a worker: train (unless base) and evaluate one model."""

    label: str
    method: str | None  # None: the base model
    seed: int
    run_dir: str | None
    overrides: dict[str, Any]
    config: str
    base_dir: str
    base_sha: str
    eval_info: dict[str, Any]
    tiny: dict[str, Any]
    cached_eval: dict[str, Any] | None
    semantic: bool
    progress: bool


# ---------------------------------------------------------------------------------------------
# Helpers


def _weights_sha(folder: str | os.PathLike[str]) -> str:
    """sha256 over a model folder's ``*.safetensors`` files (identifies the weights)."""
    h = hashlib.sha256()
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def run_dir_name(method: str, seed: int) -> str:
    """``countdown_<method>`` for seed 0, ``countdown_<method>_seed<s>`` otherwise."""
    return f"countdown_{method}" if seed == 0 else f"countdown_{method}_seed{seed}"


def _prune_checkpoints(run_dir: Path) -> None:
    """Keep only the newest complete checkpoint of a finished run."""
    from llm.trainer import CHECKPOINTS, latest_checkpoint

    last = latest_checkpoint(run_dir)
    for p in (run_dir / CHECKPOINTS).glob("*"):
        if p != last and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The worker: train (or reuse) a run, then evaluate (or reuse) it


def _train_run(job: _Job) -> tuple[Path, dict[str, Any]]:
    """Train `job`'s run unless a finished matching one exists; returns (checkpoint, marker)."""
    from llm.config import config_to_toml, load_config
    from llm.trainer import latest_checkpoint, train

    assert job.run_dir is not None and job.method is not None
    out = Path(job.run_dir)
    cfg = load_config(job.config, **job.overrides)
    marker_path = out / RUN_MARKER
    marker = _read_json(marker_path)
    saved = out / "config.toml"
    same = (
        marker is not None
        and marker.get("base_sha") == job.base_sha
        and saved.is_file()
        and config_to_toml(load_config(saved)) == config_to_toml(cfg)
    )
    ckpt = latest_checkpoint(out) if same else None
    if (
        same
        and marker.get("finished")
        and ckpt is not None
        and ckpt.name == f"step_{cfg.steps:06d}"
    ):
        return ckpt, {**marker, "reused": True}
    if out.exists() and not same:
        # A run of another config or another base model: its checkpoints are not this run's.
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    prior = float(marker.get("train_seconds", 0.0)) if same and marker else 0.0
    marker = {"base_sha": job.base_sha, "finished": False, "train_seconds": prior}
    _write_json(marker_path, marker)
    start = time.perf_counter()
    train(cfg, out, resume=ckpt is not None, progress=job.progress)
    marker["train_seconds"] = round(prior + time.perf_counter() - start, 1)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tail = metrics[-max(1, len(metrics) // 10) :]
    marker["train_reward_first"] = float(
        np.mean([m["charts/reward_mean"] for m in metrics[: len(tail)]])
    )
    marker["train_reward_last"] = float(np.mean([m["charts/reward_mean"] for m in tail]))
    marker["finished"] = True
    _write_json(marker_path, marker)
    _prune_checkpoints(out)
    ckpt = latest_checkpoint(out)
    assert ckpt is not None
    return ckpt, marker


def _run_job(job: _Job) -> dict[str, Any]:
    """Train and evaluate one model (runs in a worker process, or inline with ``jobs=1``).

    Returns ``{"label", "result", "info", "reused_eval", "marker"}``; `result` is
    `llm.eval.evaluate`'s dict, `info` what eval.json records next to it.
    """
    import torch

    from llm.config import load_config
    from llm.eval import evaluate
    from llm.tiny import TinyConfig, tiny_problems
    from llm.trainer import load_model_and_tokenizer, make_backend

    torch.set_num_threads(1)  # see the module docstring
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # per-checkpoint bars would break tqdm's line
    except ImportError:
        pass
    marker: dict[str, Any] = {}
    if job.method is None:
        model_path = Path(job.base_dir)
        cfg = load_config(job.config, **job.overrides)
    else:
        model_path, marker = _train_run(job)
        cfg = load_config(job.config, **job.overrides)
    info = {"model": str(model_path), "weights_sha256": _weights_sha(model_path), **job.eval_info}
    cached = job.cached_eval
    if cached is not None and all(cached.get(k) == v for k, v in info.items() if k != "model"):
        return {"label": job.label, "result": cached, "info": info, "reused_eval": True,
                "marker": marker}  # fmt: skip
    torch.set_num_threads(1)  # train() sets the config's thread count; evaluation uses one too
    tiny = TinyConfig.from_dict(job.tiny)
    problems = tiny_problems(tiny, "heldout", job.eval_info["eval_problems"])
    model, tokenizer = load_model_and_tokenizer(model_path, "cpu")
    encoder = None
    if job.semantic:
        from llm.diversity import load_encoder

        encoder = load_encoder("cpu")
    start = time.perf_counter()
    result = evaluate(
        make_backend(cfg, model, tokenizer),
        cfg.task,
        problems,
        n=job.eval_info["eval_samples"],
        template=cfg.template,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.eval.temperature,
        top_p=cfg.top_p,
        seed=job.eval_info["eval_seed"],
        distinct=cfg.distinct,
        encoder=encoder,
    )
    info["eval_seconds"] = round(time.perf_counter() - start, 1)
    return {"label": job.label, "result": result, "info": info, "reused_eval": False,
            "marker": marker}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Aggregation, table and figure


def _aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean (and, over several seeds, the half range) of one method's per-seed numbers."""

    def stat(values: list[float | None]) -> dict[str, float] | None:
        vals = [v for v in values if v is not None]
        if not vals:
            return None
        return {"mean": float(np.mean(vals)), "spread": float((max(vals) - min(vals)) / 2)}

    ks = list(runs[0]["pass_at_k"])
    return {
        "seeds": [r["seed"] for r in runs],
        "hyper": runs[0]["hyper"],
        "pass_at_k": {k: stat([r["pass_at_k"][k] for r in runs]) for k in ks},
        "distinct_correct": stat([r["distinct_correct"] for r in runs]),
        "self_bleu": stat([r["self_bleu"] for r in runs]),
        "accuracy": stat([r["accuracy"] for r in runs]),
        "solution_coverage": stat([r["solution_coverage"] for r in runs]),
        "train_seconds": stat([r.get("train_seconds") for r in runs]),
        "train_reward_first": stat([r.get("train_reward_first") for r in runs]),
        "train_reward_last": stat([r.get("train_reward_last") for r in runs]),
    }


def _fmt(s: dict[str, float] | None, digits: int = 3, spread: bool = True) -> str:
    if s is None:
        return "-"
    text = f"{s['mean']:.{digits}f}"
    if spread:
        text += f" ± {s['spread']:.{digits}f}"
    return text


def results_table(summary: dict[str, Any]) -> str:
    """The Markdown results table of a `figures/llm_countdown.json` mapping."""
    ks = [k for k in ("1", "4", "16", "32") if k in summary["base"]["pass_at_k"]]
    head = ["method", "hyper-parameters", *(f"pass@{k}" for k in ks)]
    head += ["distinct correct / problem", "Self-BLEU", "train reward first→last 10%", "train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, agg in summary["methods"].items():
        hyper = ", ".join(f"{k}={v}" for k, v in agg["hyper"].items()) or "defaults"
        reward = "-"
        if agg.get("train_reward_first") and agg.get("train_reward_last"):
            reward = (
                f"{agg['train_reward_first']['mean']:.3f} → {agg['train_reward_last']['mean']:.3f}"
            )
        row = [label, hyper if label != "base" else "-"]
        many = len(agg["seeds"]) > 1  # show the spread over seeds, even when it is 0
        row += [_fmt(agg["pass_at_k"][k], spread=many) for k in ks]
        row += [_fmt(agg["distinct_correct"], 2, many), _fmt(agg["self_bleu"], spread=many)]
        row.append(reward)
        row.append(_fmt(agg.get("train_seconds"), 0, spread=False))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _base_entry(result: dict[str, Any]) -> dict[str, Any]:
    def one(v: float | None) -> dict[str, float] | None:
        return None if v is None else {"mean": float(v), "spread": 0.0}

    return {
        "seeds": [],
        "hyper": {},
        "pass_at_k": {k: one(v) for k, v in result["pass_at_k"].items()},
        "distinct_correct": one(result["distinct_correct"]),
        "self_bleu": one(result["self_bleu"]),
        "accuracy": one(result["accuracy"]),
        "solution_coverage": one(result["solution_coverage"]),
        "train_seconds": None,
    }


def plot_summary(summary: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """pass@k vs k (left) and pass@k minus the base model's (right; bars: range over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    base = summary["base"]["pass_at_k"]
    ks = [int(k) for k in base]
    base_v = np.array([base[k]["mean"] for k in base])
    ax1.plot(ks, base_v, "k--", marker="o", label="base")
    ax2.axhline(0.0, color="k", ls="--", lw=1, label="base")
    for label, agg in summary["methods"].items():
        if label == "base":
            continue
        mean = np.array([agg["pass_at_k"][k]["mean"] for k in base])
        spread = np.array([agg["pass_at_k"][k]["spread"] for k in base])
        (line,) = ax1.plot(ks, mean, marker="o", ms=4, label=label)
        ax2.errorbar(
            ks, mean - base_v, yerr=spread if spread.any() else None, marker="o", ms=4,
            capsize=2, color=line.get_color(), label=label,
        )  # fmt: skip
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("pass@k")
    ax1.set_ylim(0, 1)
    ax1.set_title("held-out Countdown, tiny model")
    ax2.set_ylabel("pass@k − base pass@k")
    ax2.set_title("gain over the base model (bars: range over seeds)")
    ax2.legend(fontsize=8)
    s = summary["settings"]
    fig.suptitle(
        f"{s['eval_problems']} held-out problems × {s['eval_samples']} samples; "
        f"{s['steps']} steps, lr {s['lr']:g}, seeds {s['seeds']}",
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
        ValueError: an unknown method, or an invalid config.
    """
    import shaping
    from llm.config import load_config
    from llm.eval import write_eval
    from llm.tiny import TinyConfig, ensure_base_model

    s = settings.resolved()
    unknown = [m for m in s.methods if m not in shaping.METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; known: {sorted(shaping.METHODS)}")
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
    base_sha = _weights_sha(base_dir)

    # 2 + 3. Runs and their evaluations.
    common = {"model_path": str(base_dir), "build_base_model": False, "num_threads": 1}
    if s.steps is not None:
        common["steps"] = s.steps
    base_cfg = load_config(s.config, **common)
    eval_info = {
        "eval_problems": s.eval_problems,
        "eval_samples": s.eval_samples,
        "eval_seed": s.eval_seed,
        "eval_source": "llm.tiny heldout",
        "eval_temperature": base_cfg.eval.temperature,
        "semantic": s.semantic,
    }
    eval_dir = runs / "eval"
    existing = _read_json(eval_dir / "eval.json") or {}
    jobs = [
        _Job("base", None, 0, None, common, s.config, str(base_dir), base_sha, eval_info,
             asdict(tiny), existing.get("base"), s.semantic, s.progress)
    ]  # fmt: skip
    for seed in s.seeds:
        for method in s.methods:
            label = method if seed == 0 else f"{method}_seed{seed}"
            overrides = {**common, "method": method, "seed": seed, "hyper": s.hyper.get(method, {})}
            load_config(s.config, **overrides)  # fail early on a bad hyper-parameter
            jobs.append(
                _Job(label, method, seed, str(runs / run_dir_name(method, seed)), overrides,
                     s.config, str(base_dir), base_sha, eval_info, asdict(tiny),
                     existing.get(label), s.semantic, s.progress and s.jobs == 1)
            )  # fmt: skip

    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    outcomes: dict[str, dict[str, Any]] = {}
    bar = tqdm(total=len(jobs), desc="runs (train + eval)", disable=not s.progress, unit="run")
    if s.jobs <= 1:
        for job in jobs:
            bar.set_postfix_str(job.label)
            outcomes[job.label] = _run_job(job)
            bar.update(1)
    else:
        # spawn, not fork: a forked child inherits torch's thread pools and can deadlock.
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(max_workers=s.jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_run_job, job): job.label for job in jobs}
            for fut in cf.as_completed(futures):
                outcomes[futures[fut]] = fut.result()
                bar.set_postfix_str(futures[fut])
                bar.update(1)
    bar.close()
    phases["train_and_eval"] = time.perf_counter() - t0
    # A rerun reuses finished runs: its phase timings then do not measure training.
    reused = {
        "runs": sum(1 for j in jobs[1:] if outcomes[j.label]["marker"].get("reused")),
        "evals": sum(1 for j in jobs if outcomes[j.label]["reused_eval"]),
        "of": len(jobs) - 1,
    }
    for job in jobs:  # in job order, so eval.json's order does not depend on scheduling
        out = outcomes[job.label]
        if not out["reused_eval"]:
            result = {k: v for k, v in out["result"].items() if k not in out["info"]}
            write_eval(eval_dir, job.label, result, **out["info"])

    # 4. Summary, table, figure.
    per_seed: dict[str, list[dict[str, Any]]] = {}
    for job in jobs[1:]:
        out = outcomes[job.label]
        r, m = out["result"], out["marker"]
        per_seed.setdefault(job.method or "", []).append(
            {
                "seed": job.seed,
                "label": job.label,
                "hyper": job.overrides["hyper"],
                "pass_at_k": r["pass_at_k"],
                "distinct_correct": r["distinct_correct"],
                "self_bleu": r["self_bleu"],
                "accuracy": r["accuracy"],
                "solution_coverage": r["solution_coverage"],
                "distinct_n": r["distinct_n"],
                "semantic_cosine_correct": r.get("semantic_cosine_correct"),
                "train_seconds": m.get("train_seconds"),
                "train_reward_first": m.get("train_reward_first"),
                "train_reward_last": m.get("train_reward_last"),
                "eval_seconds": out["info"].get("eval_seconds", r.get("eval_seconds")),
            }
        )
    base_result = outcomes["base"]["result"]
    summary: dict[str, Any] = {
        "settings": {
            "config": os.path.relpath(s.config, ROOT) if Path(s.config).is_absolute() else s.config,
            "methods": list(s.methods),
            "seeds": list(s.seeds),
            "steps": base_cfg.steps,
            "lr": base_cfg.lr,
            "group_size": base_cfg.group_size,
            "prompts_per_step": base_cfg.prompts_per_step,
            "quick": s.quick,
            "base_model": asdict(tiny),
            **eval_info,
        },
        "base": _base_entry(base_result),
        "methods": {"base": _base_entry(base_result)},
        "per_seed": per_seed,
        "timings_seconds": {},
        "reused": reused,
    }
    for method, rows in per_seed.items():
        summary["methods"][method] = _aggregate(rows)
    base_rows = summary["base"]["pass_at_k"]
    for agg in summary["methods"].values():
        agg["pass_at_k_minus_base"] = {
            k: (v["mean"] - base_rows[k]["mean"]) if v else None
            for k, v in agg["pass_at_k"].items()
        }
    t0 = time.perf_counter()
    plot_summary(summary, figures / "llm_countdown_passk.png")
    table = results_table(summary)
    phases["figures"] = time.perf_counter() - t0
    phases["total"] = time.perf_counter() - t_start
    summary["timings_seconds"] = {k: round(v, 1) for k, v in phases.items()}
    _write_json(figures / "llm_countdown.json", summary)
    (figures / "llm_countdown_results.md").write_text(_markdown(summary, table), encoding="utf-8")
    return summary


def _markdown(summary: dict[str, Any], table: str) -> str:
    s, r = summary["settings"], summary["reused"]
    spread = " (mean over seeds ± half their range)" if len(s["seeds"]) > 1 else ""
    return (
        "# Countdown on the offline tiny model: base vs RL-fine-tuned methods\n\n"
        f"Written by `python -m llm reproduce`{' --quick' if s['quick'] else ''}. "
        f"Config `{s['config']}`: {s['steps']} steps of {s['prompts_per_step']} prompts × "
        f"{s['group_size']} samples, lr {s['lr']:g}, seeds {s['seeds']}{spread}. "
        f"Evaluation: the first {s['eval_problems']} problems of llm.tiny's held-out stream, "
        f"{s['eval_samples']} samples each at temperature {s['eval_temperature']:g}, sampling "
        f"seed {s['eval_seed']} for every model; unbiased pass@k; distinct correct = distinct "
        "correct solutions per problem (up to commutativity); Self-BLEU in [0, 1], lower = more "
        "diverse. Train reward: mean reward of the first and last 10% of training steps.\n\n"
        f"{table}\n\n"
        f"Timings of this invocation (s): {json.dumps(summary['timings_seconds'])}; it reused "
        f"{r['runs']} of {r['of']} finished runs and {r['evals']} of {r['of'] + 1} evaluations "
        "(train s: each run's own training time, recorded when it ran).\n"
    )


def format_summary(summary: dict[str, Any]) -> str:
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
