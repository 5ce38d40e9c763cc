"""How far a pick's confirmed lift falls below its exploratory one: the calibration's designs against
the committed studies.

    python bench/calibration_pick_drop.py [--design D ...] [--replicates 100] [--draws 300]
        [--out bench/results/calibration_pick_drop.json]

The exploration picks each method's (setting, checkpoint) with the largest estimate, so the picked
estimate rides up on its noise and the fresh confirmation reads it lower (the winner's curse; the
two-stage design is there to absorb it). The *drop* of a pick is its exploratory pass@k lift minus
its confirmed one, both estimates, in points: what a reader of an exploratory table sees. This
script measures it two ways, side by side:

- **simulated**: every study of `experiment.calibration.calibrate` on a design (the pick rule in
  force, `experiment.study.PICK_RULE`), with `experiment.study.select` and `experiment.study.confirm`
  wrapped inside this process to record each pick's two estimates (nothing in the package
  changes);
- **committed**: every committed study's picks that both stages read (`figures/*study*/study.json`,
  `figures/gpu/study.json`: ``picks.pass_at_k[label].lift`` against ``confirmed.pass_at_k[label].lift``).

A committed study whose drop is well above its design's says that the design's exploration is less
noisy, or its settings less alike, than the study's were. Prints both tables; writes them to
`--out`.
"""

from __future__ import annotations

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy loads)

# isort: split
import argparse
import json
from pathlib import Path

import numpy as np

from experiment import calibration as C
from experiment import study as S

ROOT = Path(__file__).resolve().parents[1]
DESIGN_OF = {"smooth": "toy_study_sharpening", "mild": "llm_study_countdown_mild",
             "narrow": "llm_study_countdown_strong", "narrow_seed": "llm_study_countdown_strong",
             "rule": "llm_study_countdown_rule", "real": "gpu"}  # fmt: skip
"""The committed study each design was shaped after (docs/statistics.md)."""


def committed_drops() -> dict[str, list[float]]:
    """Per committed study folder, the drop (points) of every pass@k pick both stages read."""
    out = {}
    for path in sorted([*ROOT.glob("figures/*study*/study.json"), ROOT / "figures/gpu/study.json"]):
        doc = json.loads(path.read_text())
        confirmed = doc["confirmed"]["pass_at_k"]
        out[path.parent.name] = [
            100 * (p["lift"] - confirmed[label]["lift"])
            for label, p in doc["picks"]["pass_at_k"].items()
            if p.get("lift") is not None and (confirmed.get(label) or {}).get("lift") is not None
        ]
    return out


def simulated_drops(design: str, replicates: int, draws: int) -> dict[str, list[float]]:
    """Per method of `design`, the drop (points) of its pick in each simulated study."""
    select, confirm = S.select, S.confirm
    last: dict[str, dict] = {}
    drops: dict[str, list[float]] = {}

    def recording_select(explore, rule=None):
        got = select(explore, rule=rule)
        if rule in (None, S.PICK_RULE):
            last.clear()
            last.update(got)
        return got

    def recording_confirm(section, labels, alpha=0.05):
        conf = confirm(section, labels, alpha=alpha)
        for label, c in conf.items():
            p = last.get(label)
            if p is not None and p.get("lift") is not None and c.get("lift") is not None:
                drops.setdefault(label, []).append(100 * (p["lift"] - c["lift"]))
        return conf

    S.select, S.confirm = recording_select, recording_confirm
    try:
        C.calibrate(C.DESIGNS[design], replicates=replicates, draws=draws)
    finally:
        S.select, S.confirm = select, confirm
    return drops


def _summary(values: list[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return {"n": int(v.size), "mean": float(v.mean()), "se": se, "median": float(np.median(v))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--design", action="append", choices=sorted(DESIGN_OF))
    parser.add_argument("--replicates", type=int, default=100)
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--out", default="bench/results/calibration_pick_drop.json")
    args = parser.parse_args()
    doc: dict = {"replicates": args.replicates, "draws": args.draws, "designs": {},
                 "committed": {k: _summary(v) for k, v in committed_drops().items() if v}}  # fmt: skip
    print(
        "| design | simulated drop: mean ± se (median), points | committed study | its drop: mean ± se (median), picks |"
    )
    print("|---|---|---|---|")
    for name in args.design or list(DESIGN_OF):
        drops = simulated_drops(name, args.replicates, args.draws)
        every = [d for v in drops.values() for d in v]
        doc["designs"][name] = {"all": _summary(every),
                                "by_method": {k: _summary(v) for k, v in drops.items()}}  # fmt: skip
        s, study = doc["designs"][name]["all"], DESIGN_OF[name]
        c = doc["committed"].get(study)
        theirs = f"{c['mean']:+.2f} ± {c['se']:.2f} ({c['median']:+.2f}), {c['n']}" if c else "—"
        print(f"| {name} | {s['mean']:+.2f} ± {s['se']:.2f} ({s['median']:+.2f}) | {study} | {theirs} |",
              flush=True)  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
