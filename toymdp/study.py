"""`python -m toymdp study --config FILE [--out DIR]`: a two-stage toy study with verdicts.

A study file is a toy sweep file (`toymdp.sweep`: the exploratory stage, every method's
coefficients swept against GRPO's own curve) plus a ``[study]`` table (`StudySpec`): the fresh
dataset draws, training seeds and key root of the confirmation stage, the claimed size of a lift
and the family-wise level. The stages (`experiment.study`):

1. **explore**: the sweep as written; per method label and measure, the pick with the largest
   lower bound of its lift (`experiment.study.select`; one pick per label, by the pass@k lift);
2. **confirm**: the reference entries as written plus one ``fixed`` entry per pick, trained on
   the fresh keys and evaluated on fresh draws (new prompts and correct sets); per measure, each
   pick's lift with Holm over the picks (`experiment.study.confirm`), the minimum detectable lift,
   and the verdict of every claim of `experiment.study.CLAIMS` whose method the study has.

Outputs in OUT (default ``runs/toy_study/<config stem>``): ``explore/`` and ``confirm/`` (each a
sweep folder: results.json, lifts.md, frontier.png), ``study.json`` (provenance: git commit,
config hash, CPU model, numerics level; the picks, the confirmed lifts, the verdicts and the
problems the design would need for the MDE goal) and ``verdicts.md``. Each stage is cached like a
sweep, so a rerun costs only the analysis.
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numerics
from experiment import report, store
from experiment import study as S
from experiment.schema import meta, option
from toymdp import sweep as SW
from toymdp import sweep_spec

__all__ = ["StudySpec", "cpu_model", "git_commit", "load_study", "run_study"]


@dataclass(frozen=True)
class StudySpec:
    """``[study]``: the confirmation stage and the claims' rule (module docstring)."""

    name: str = option("toy study", "the study's name in the tables")
    confirm_draws: list[int] = field(default_factory=lambda: list(range(100, 108)), metadata=meta(
        "dataset draws of the confirmation (fresh: not among env.draws)", ge=0,
        length=(2, None)))  # fmt: skip
    confirm_seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3], metadata=meta(
        "training seeds of the confirmation (indices of keys split from confirm_key)", ge=0,
        length=(1, None)))  # fmt: skip
    confirm_key: int = option(1, "root of the confirmation's training keys (≠ train.seed)", ge=0)
    claim_size: float = option(1.5, "a claim's size: points of pass@k (MDE goal)", gt=0)
    claim_size_distinct: float = option(0.1, "a claim's size in distinct correct / prompt", gt=0)
    alpha: float = option(0.05, "family-wise level of Holm over the picks", gt=0, lt=1)


def load_study(path: Path) -> tuple[dict[str, Any], StudySpec]:
    """The exploratory sweep document (the file without ``[study]``) and its `StudySpec`.

    Raises:
        ValueError: naming the file and key: a bad ``[study]`` key, confirmation draws that are
            also exploratory draws, or a confirmation key root equal to ``train.seed``.
    """
    doc = dict(store.read_toml(path))
    table = doc.pop("study", {})
    try:
        spec = sweep_spec.build_table(StudySpec, "study", table)
        cfg = sweep_spec.parse_config(doc)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    reused = sorted(set(spec.confirm_draws) & set(cfg.env.draws))
    if reused:
        raise ValueError(f"{path}: study.confirm_draws: {reused} are exploratory draws (env.draws)")
    if spec.confirm_key == cfg.train.seed:
        raise ValueError(f"{path}: study.confirm_key: {spec.confirm_key} equals train.seed")
    return doc, spec


def confirmation_doc(
    doc: Mapping[str, Any], spec: StudySpec, picks: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The confirmation sweep: `doc`'s reference entries, one fixed entry per picked label (its
    picked setting), the fresh draws, seeds and key root."""
    cfg = sweep_spec.parse_config(doc)
    out = copy.deepcopy(dict(doc))
    out["env"] = {**out.get("env", {}), "draws": list(spec.confirm_draws)}
    out["train"] = {**out.get("train", {}), "seed": spec.confirm_key}
    out["seeds"] = list(spec.confirm_seeds)
    methods = []
    for m in cfg.methods:
        if m.label in cfg.reference:
            methods.append(
                next(e for e in doc["methods"] if e.get("label", e["method"]) == m.label)
            )
        elif m.label in picks:
            fixed = {**m.fixed, **picks[m.label]["params"]}
            lr = fixed.pop("lr", None)
            entry = {"method": m.method, "label": m.label, "fixed": fixed}
            if lr is not None:
                entry["points"] = [{"lr": lr}]
            methods.append(entry)
    out["methods"] = methods
    return out


def git_commit() -> str:
    """The checkout's commit (``unknown`` outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; `platform.processor()` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _claims(spec: StudySpec, confirmed: Mapping[str, Any], sharp: Mapping[str, Any]) -> list:
    rows = []
    for cid, label, measure, text in S.CLAIMS:
        if cid == "grpo_sharpens":
            rows.append({"study": spec.name, "claim": cid, "text": text,
                         "verdict": sharp["verdict"], "lift": sharp["y"] * 100,
                         "lo": sharp["y_lo"] * 100, "hi": sharp["y_hi"] * 100, "mde": None,
                         "size": 0.0, "unit": "pass@k gain, points"})  # fmt: skip
            continue
        r = confirmed.get(measure, {}).get(label)
        if r is None:
            continue
        scale, size = (100.0, spec.claim_size) if measure == "pass_at_k" else (
            1.0, spec.claim_size_distinct)  # fmt: skip
        rows.append({
            "study": spec.name, "claim": cid, "text": text,
            "verdict": S.claim_verdict(r, size / scale),
            "lift": None if r["lift"] is None else scale * r["lift"],
            "lo": None if r["lo"] is None else scale * r["lo"],
            "hi": None if r["hi"] is None else scale * r["hi"],
            "mde": None if r["mde"] is None else scale * r["mde"], "size": size,
            "unit": "points" if measure == "pass_at_k" else "per prompt",
        })  # fmt: skip
    return rows


def run_study(
    config_path: Path, out: Path | None = None, *, use_cache: bool = True, progress: bool = True
) -> dict[str, Any]:
    """Both stages of the study in `config_path` (module docstring); returns study.json's dict.

    Raises:
        ValueError: naming the file and key of a bad configuration.
    """
    config_path = Path(config_path)
    doc, spec = load_study(config_path)
    out = Path(out) if out is not None else Path("runs/toy_study") / config_path.stem
    explore = SW.sweep_config(sweep_spec.parse_config(doc), out / "explore",
                              use_cache=use_cache, progress=progress)  # fmt: skip
    ref = sweep_spec.parse_config(doc).reference
    picks = {measure: S.select(explore["doc"]["frontier"][measure]) for measure in report.MEASURES}
    chosen = picks["pass_at_k"]  # one pick per label: by its pass@k lift
    cdoc = confirmation_doc(doc, spec, chosen)
    confirm = SW.sweep_config(sweep_spec.parse_config(cdoc), out / "confirm",
                              use_cache=use_cache, progress=progress)  # fmt: skip
    labels = list(chosen)
    confirmed = {measure: S.confirm(confirm["doc"]["frontier"][measure], labels, alpha=spec.alpha)
                 for measure in report.MEASURES}  # fmt: skip
    sharp = S.sharpening_verdict(confirm["doc"]["frontier"]["pass_at_k"], ref[0])
    claims = _claims(spec, confirmed, sharp)
    draws = len(spec.confirm_draws)
    need = {label: S.problems_for(100 * r["mde"], draws, spec.claim_size)
            for label, r in confirmed["pass_at_k"].items() if r["mde"]}  # fmt: skip
    text = json.dumps(store.read_toml(config_path), sort_keys=True, default=str)
    result = {
        "study": spec.name,
        "provenance": {
            "config": str(config_path), "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "git_commit": git_commit(), "cpu": cpu_model(), "numerics": numerics.tag(),
        },
        "design": {"explore_draws": list(sweep_spec.parse_config(doc).env.draws),
                   "explore_seeds": list(sweep_spec.parse_config(doc).seeds),
                   "confirm_draws": list(spec.confirm_draws),
                   "confirm_seeds": list(spec.confirm_seeds), "confirm_key": spec.confirm_key,
                   "alpha": spec.alpha, "claim_size": spec.claim_size,
                   "claim_size_distinct": spec.claim_size_distinct},
        "picks": {m: {label: {k: p[k] for k in ("setting", "step", "params", "lift", "lift_lo",
                                                 "lift_hi")}
                      for label, p in ps.items()} for m, ps in picks.items()},
        "confirmed": confirmed,
        "grpo_sharpens": sharp,
        "claims": claims,
        "draws_for_goal": need,
    }  # fmt: skip
    store.write_json(out / "study.json", result, indent=1)
    store.write_text(out / "verdicts.md", verdicts_text(result))
    return result


def verdicts_text(result: Mapping[str, Any]) -> str:
    """verdicts.md: the design, the confirmation table, GRPO's sharpening and the claims."""
    d = result["design"]
    sharp = result["grpo_sharpens"]
    intro = (
        f"# {result['study']}: select, then confirm\n\n"
        f"Exploratory stage: draws {d['explore_draws']}, seeds {d['explore_seeds']}; per method "
        "the setting with the largest lower bound of its pass@k lift. Confirmation: those picks "
        f"and GRPO's reference entries re-trained on fresh keys (root {d['confirm_key']}, seeds "
        f"{d['confirm_seeds']}) and evaluated on fresh draws {d['confirm_draws']}; Holm at "
        f"{d['alpha']} over the picks; MDE: the lift the first Holm step detects with 80% power. "
        f"Provenance: {json.dumps(result['provenance'])}.\n\n"
        f"GRPO's final checkpoint: pass@1 {100 * sharp['x']:+.2f} [{100 * sharp['x_lo']:+.2f}, "
        f"{100 * sharp['x_hi']:+.2f}], pass@k {100 * sharp['y']:+.2f} [{100 * sharp['y_lo']:+.2f}"
        f", {100 * sharp['y_hi']:+.2f}] points → GRPO sharpens: **{sharp['verdict']}**."
    )
    table = S.verdicts_markdown(result["confirmed"], result["picks"], intro)
    claims = S.claims_table(result["claims"])
    need = ", ".join(f"{k} {v}" for k, v in result["draws_for_goal"].items())
    return (f"{table}\n## Claims\n\n{claims}\nDraws each comparison would need for an MDE of "
            f"{d['claim_size']} points: {need}.\n")  # fmt: skip
