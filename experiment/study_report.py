"""A study's reports, provenance and publishing (`experiment.study` decides; this writes it down):
verdicts.md (`study_markdown`: the confirmation tables, the curve-free check, the claims, the
designs for the MDE goal), the README's claims table (`claims_table`), a study's provenance
(`provenance`: config hash, git commit, CPU and numerics level); publishing a study into a
committed folder is `experiment.reread.publish` (it checks that the folder holds one study).
Sources: docs/statistics.md (the tables' contents).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import shaping
from experiment import estimand, schema

__all__ = [
    "CPU_FLAGS",
    "UNEQUAL",
    "claims_table",
    "cpu_id",
    "cpu_model",
    "designs_markdown",
    "dominance_markdown",
    "git_commit",
    "measures_markdown",
    "provenance",
    "study_markdown",
    "verdicts_markdown",
]


def _pts(v: float | None, scale: float) -> str:
    return "n/a" if v is None else f"{scale * v:+.2f}"


_SIGN = {"above": 1, "below": -1}
"""A `confirm` record's Holm decision on its lift (``verdict``) as a sign."""
_HOLM = {"above": "> 0", "below": "< 0", "none": "neither"}
"""The confirmation table's words for a `confirm` record's ``verdict``."""


def _what(measure: str) -> str:
    return "pass@k" if measure == "pass_at_k" else "distinct correct"


def verdicts_markdown(
    confirmed: Mapping[str, Mapping[str, Mapping[str, Any]]],
    picks: Mapping[str, Mapping[str, Any]],
    intro: str,
) -> str:
    """The confirmation table: per measure and picked label, its pick (setting and step, chosen by
    the pass@k lift; the exploratory lift of the measure's own best), the confirmed lift [CI]
    (labelled above GRPO's pass@1 range: `experiment.estimand.range_label`), p, Holm's p, MDE and
    Holm's decision on the lift (> 0, < 0, or neither; points for pass@k, solutions per problem
    for distinct correct). The claims' words are the claims table's (`claims_table`).

    Args:
        confirmed: ``{measure: {label: confirm record}}``. picks: ``{measure: {label: record with
            setting, step, lift}}`` (`select`'s records)."""
    parts = [intro]
    for measure, rows in confirmed.items():
        scale = 100.0 if measure == "pass_at_k" else 1.0
        parts.append(f"\n### {measure}\n")
        parts.append("| method | pick (setting, step) | exploratory lift | confirmed lift [95% CI] "
                     "| p | Holm p | MDE (80%) | lift after Holm |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
        for label, r in rows.items():
            pick = picks.get("pass_at_k", {}).get(label)  # the pick is by the pass@k lift
            own = picks.get(measure, {}).get(label)
            explo = _pts(own["lift"], scale) if own else "n/a"
            where = f"{pick['setting']}, {pick['step']}" if pick else f"{r['setting']}, {r['step']}"
            ci = (f"{_pts(r['lift'], scale)} [{_pts(r['lo'], scale)}, {_pts(r['hi'], scale)}]"
                  if r["lift"] is not None else f"n/a ({r['status']})")  # fmt: skip
            above = estimand.range_label(r["status"], _SIGN.get(r["verdict"], 0), _what(measure))
            ci += f" ({above})" if above and r["lift"] is not None else ""
            p = "" if r["p"] is None else f"{r['p']:.3f}"
            ph = "" if r["p_holm"] is None else f"{r['p_holm']:.3f}"
            mde = "" if r["mde"] is None else f"{scale * r['mde']:.2f}"
            parts.append(f"| {label} | {where} | {explo} | {ci} | {p} | {ph} "
                         f"| {mde} | {_HOLM.get(r['verdict'], r['verdict'])} |")  # fmt: skip
        parts.append(dominance_markdown(rows, scale, legend=measure == next(iter(confirmed))))
    return "\n".join(parts) + "\n"


def dominance_markdown(
    rows: Mapping[str, Mapping[str, Any]], scale: float, *, legend: bool = True
) -> str:
    """The curve-free check under a confirmation table: per pick, GRPO's model (base included)
    that most clearly has more pass@1 *and* more of the measure, the two differences (GRPO minus
    pick, in the table's units) and the p-value (intersection-union of the two one-sided t tests,
    Bonferroni over GRPO's models: `experiment.inference.dominance`), after a `legend` that says
    so. Empty without records."""
    found = {label: r["dominated_by"] for label, r in rows.items() if r.get("dominated_by")}
    if not found:
        return ""
    text = (
        "Curve-free check: GRPO's own model with the most evidence of more pass@1 *and* more "
        "of the measure than the pick (differences GRPO minus pick; p: both one-sided t "
        "tests (intersection-union), Bonferroni over GRPO's models). A small p says that "
        "GRPO, stopped or tuned at that point, beats the pick on both axes, whatever its "
        "curve does between its points."
        if legend
        else "Curve-free check (as above):"
    )
    lines = [f"\n{text}\n", "| method | GRPO's model | pass@1 | measure | p |\n"
             "|---|---|---|---|---|"]  # fmt: skip
    for label, d in found.items():
        lines.append(f"| {label} | {d['setting']}, {d['step']} | {100 * d['dx']:+.2f} "
                     f"| {scale * d['dy']:+.2f} | {d['p']:.3f} |")  # fmt: skip
    return "\n".join(lines)


_WHY_NO_LIFT = {
    "se 0": "never left the base",
    "pending": "the procedure in force picks a setting the confirmation did not train: `study "
    "--complete` trains it",
    None: "below GRPO's range",
}
"""Why a claim's confirmed model has no lift, by its status (any other: below the range)."""
_WORD_SIGN = {"supported": 1, "smaller than claimed": 1, "below GRPO": -1}
"""The sign of a claim's lift its word establishes (a row without ``range``: `claims_table`)."""
UNEQUAL = "unequal budgets: GRPO tuned more"
"""The claims table's mark of a study whose methods had less tuning than GRPO (the words compare
with GRPO as tuned)."""


def claims_table(rows: Sequence[Mapping[str, Any]], compact: bool = False) -> str:
    """The claims table (``compact``: each cell only the word and the lift, README.md's; else
    the full cell, docs/results.md's) from study records ``{study, claim, text, verdict, lift, lo, hi,
    mde, size, unit}`` (`experiment.study.claim_rows`; a study.json's in the five words:
    `experiment.study.translate`): one row per claim, one column per study (marked `UNEQUAL` where
    a record says ``budget`` "unequal"), each cell the word, the confirmed lift [95% CI], the MDE
    and, above GRPO's pass@1 range, its label (`experiment.estimand.range_label`; — where the
    study lacks the claim)."""
    studies = list(dict.fromkeys(r["study"] for r in rows))
    unequal = {r["study"] for r in rows if r.get("budget") == "unequal"}
    claims = list(dict.fromkeys(r["text"] for r in rows))
    cells = {(r["text"], r["study"]): r for r in rows}

    def cell(r: Mapping[str, Any] | None) -> str:
        if r is None:
            return "—"
        if r.get("claim") == "grpo_spread":
            if compact:
                return f"{r['lift']:+.1f}"
            return f"{r['lift']:+.1f} [{r['lo']:+.1f}, {r['hi']:+.1f}] ({r['where']})"
        if r.get("lift") is None:
            if compact:
                return f"**{r['verdict']}**"
            why = _WHY_NO_LIFT.get(r.get("status"), _WHY_NO_LIFT[None])
            d = r.get("dominated_by")
            if r["verdict"] == "below GRPO" and d is not None:
                why += (
                    f"; GRPO {d['setting']}, step {d['step']} beats it on both axes, p {d['p']:.3f}"
                )
            return f"**{r['verdict']}** ({why})"
        # Enough decimals to show the interval's width (a +0.04-point lift is not "+0.0"): at
        # least 1 for points and 2 for distinct correct, at most 3.
        d = 2 if r.get("unit") == "per problem" else 1
        width = r["hi"] - r["lo"] if r.get("hi") is not None and r.get("lo") is not None else 1.0
        if width > 0:
            d = min(3, max(d, math.ceil(-math.log10(width)) + 1))
        above = r.get("range") or estimand.range_label(
            r.get("status"), _WORD_SIGN.get(r["verdict"], 0),
            "distinct correct" if r.get("unit") == "per problem" else "pass@k",
        )  # fmt: skip
        if compact:  # above GRPO's range: the short label
            short = f" ({estimand.ABOVE_RANGE})" if above else ""
            return f"**{r['verdict']}** {r['lift']:+.{d}f}{short}"
        mde = "" if r.get("mde") is None else f", MDE {r['mde']:.{d}f}"
        where = f" ({above})" if above else ""
        return (f"**{r['verdict']}** {r['lift']:+.{d}f} [{r['lo']:+.{d}f}, {r['hi']:+.{d}f}]"
                f"{mde}{where}")  # fmt: skip

    heads = [f"{st} ({UNEQUAL})" if st in unequal else st for st in studies]
    out = [f"| claim | {' | '.join(heads)} |", "|---" * (len(studies) + 1) + "|"]
    for text in claims:
        out.append(f"| {text} | {' | '.join(cell(cells.get((text, st))) for st in studies)} |")
    return "\n".join(out) + "\n"


GIT_COMMIT_ENV = "SHARPENING_GIT_COMMIT"
"""Names the commit a study records where the checkout's own git metadata is not the tree's: a
GPU lease's copy of the working tree carries the session's first HEAD (bench/gpu/device_call.sh's
caller sets it to ``git rev-parse HEAD`` here)."""


def git_commit() -> str:
    """`GIT_COMMIT_ENV` when set, else the checkout's commit (``unknown`` outside a git
    checkout)."""
    if os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpuinfo() -> dict[str, str] | None:
    """The first processor's fields of /proc/cpuinfo (None where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        return None
    return fields


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; `platform.processor()` elsewhere)."""
    name = (_cpuinfo() or {}).get("model name")
    return name or platform.processor() or "unknown"


CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
"""The CPU features that decide a library's kernels here (docs/numerics.md), named in `cpu_id`."""


def cpu_id() -> str:
    """The CPU as far as the pinned numerics care: vendor, family, model and stepping, and which
    of `CPU_FLAGS` it has (/proc/cpuinfo), e.g. ``"AuthenticAMD family 26 model 2 stepping 0;
    avx2 fma avx512f avx512_bf16"``: "AMD EPYC" alone names several generations. ``unknown``
    without /proc/cpuinfo."""
    fields = _cpuinfo()
    if fields is None:
        return "unknown"
    flags = set(fields.get("flags", "").split())
    have = " ".join(f for f in CPU_FLAGS if f in flags) or "none of " + " ".join(CPU_FLAGS)
    return (f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')} stepping {fields.get('stepping', '?')}; {have}")  # fmt: skip


def provenance(config_path: str | Path, numerics_tag: str) -> dict[str, Any]:
    """A study's provenance: the config file, the SHA-256 of its parsed content, the git commit,
    the CPU model and its `cpu_id`, the numerics level (`numerics.tag()`, passed by the leg) and,
    where methods defined outside the package are registered (``--import``), their code's digests
    (``method_code``, `shaping.method_code`)."""
    text = json.dumps(schema.read_toml(config_path), sort_keys=True, default=str)
    user = shaping.method_code(shaping.METHODS)
    return {"config": str(config_path), "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "git_commit": git_commit(), "cpu": cpu_model(), "cpu_id": cpu_id(),
            "numerics": numerics_tag, **({"method_code": user} if user else {})}  # fmt: skip


def study_markdown(result: Mapping[str, Any], how: str, unit: str) -> str:
    """verdicts.md: `how` (the two stages' design in words), the provenance, GRPO's sharpening,
    the confirmation tables, the claims and the `unit`s (problems, draws) each comparison would
    need for the claimed size."""
    d, sharp = result["design"], result["grpo_sharpens"]
    intro = (
        f"# {result['study']}: select, then confirm\n\n{how} Holm at {d['alpha']} over the picks; "
        "MDE: the lift the first Holm step detects with 80% power. Provenance: "
        f"{json.dumps(result['provenance'])}.\n\n"
        f"GRPO's final checkpoint ({sharp['setting']}): pass@1 {100 * sharp['x']:+.2f} "
        f"[{100 * sharp['x_lo']:+.2f}, {100 * sharp['x_hi']:+.2f}], pass@k {100 * sharp['y']:+.2f} "
        f"[{100 * sharp['y_lo']:+.2f}, {100 * sharp['y_hi']:+.2f}] points → GRPO sharpens: "
        f"**{sharp['verdict']}**."
    )
    table = verdicts_markdown(result["confirmed"], result["picks"], intro)
    need = ", ".join(f"{k} {v}" for k, v in result["problems_for_goal"].items()) or "n/a"
    text = (f"{table}\n## Claims\n\n{claims_table(result['claims'])}\n{unit} each comparison "
            f"would need for an MDE of {d['claim_size']} points (seeds fixed): {need}.\n")  # fmt: skip
    spread = result.get("reference_spread", {}).get("pass_at_k", {})
    if spread:
        text += ("\n## GRPO's settings against each other\n\nEach reference setting's best "
                 "checkpoint against the hull of GRPO's other settings (pass@k, points): what "
                 "tuning GRPO buys. The lifts above are over the hull of all of them.\n\n"
                 "| setting | step | lift [95% CI] |\n|---|---|---|\n"
                 + "".join(f"| {k} | {r['step']} | {100 * r['lift']:+.2f} [{100 * r['lo']:+.2f}, "
                           f"{100 * r['hi']:+.2f}] |\n" for k, r in spread.items()))  # fmt: skip
    if result.get("measures"):
        text += measures_markdown(result)
    if "designs_for_goal" in result:
        text += designs_markdown(result, unit)
    return text


def measures_markdown(result: Mapping[str, Any]) -> str:
    """The confirmation's other measures (study.json's ``measures``: per model the means over
    seeds, `None` where an evaluation did not record one) of the base, GRPO's configured setting
    at its read step (`grpo_sharpens`) and each pass@k pick at its step."""
    rows = {(r["label"], r["setting"], r["step"]): r for r in result["measures"]}
    sharp = result["grpo_sharpens"]
    base = next((r for r in result["measures"] if r["step"] == 0), None)
    ref = base["label"] if base is not None else None
    chosen = [
        ("base", base),
        ("GRPO (configured)", rows.get((ref, sharp["setting"], sharp["step"]))),
    ]
    chosen += [(label, rows.get((label, p["setting"], p["step"])))
               for label, p in result["picks"]["pass_at_k"].items()]  # fmt: skip

    def cell(v: Any, scale: float = 1.0, digits: int = 2) -> str:
        return "—" if v is None else f"{scale * v:.{digits}f}"

    lines = ["\n## Other measures of the models read\n",
             "Means over the confirmation's seeds (pass@1, pass@k and maj@k in percent; maj@k: "
             "majority-vote accuracy over k samples; answer entropy in nats over a problem's "
             "final answers; distinct correct answers per problem).\n",
             "| model | setting | step | pass@1 | pass@k | maj@k | answer entropy | "
             "distinct correct |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in chosen:
        if r is None:
            continue
        lines.append(f"| {name} | {r['setting']} | {r['step']} | {cell(r['pass1'], 100, 1)} | "
                     f"{cell(r['pass_at_k'], 100, 1)} | {cell(r['maj_at_k'], 100, 1)} | "
                     f"{cell(r['answer_entropy'])} | {cell(r['distinct_correct'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _cost(v: float, unit: str) -> str:
    return f"{v / 3600:.2f} core-h" if unit == "core-s" else f"{v:.0f} {unit}"


def designs_markdown(result: Mapping[str, Any], unit: str) -> str:
    """The power calculation's table: per measure and pick, the cheapest design (`experiment.study.design_for`) that
    reaches the claimed size, from the confirmation's variance components."""
    c = result["costs"]
    lines = [f"\n## Designs for the MDE goal\n\nFrom each comparison's variance components "
             "(seed, problem, residual) measured in the confirmation, the cheapest seeds × "
             f"{unit.lower()} whose predicted MDE (80% power, the first Holm step) reaches the "
             f"claimed size; cost = seeds × ({c['run']:.3g} + {unit.lower()} × {c['problem']:.3g}) "
             f"{c['unit']} per setting. Not reached within 64 seeds × 16,384: —.\n",
             f"| measure | method | seeds | {unit.lower()} | predicted MDE | cost per setting |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for measure, rows in result["designs_for_goal"].items():
        scale = 100.0 if measure == "pass_at_k" else 1.0
        for label, r in rows.items():
            if r is None:
                lines.append(f"| {measure} | {label} | — | — | — | — |")
            else:
                lines.append(f"| {measure} | {label} | {r['seeds']} | {r['problems']} | "
                             f"{scale * r['mde']:.2f} | {_cost(r['cost'], c['unit'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"
