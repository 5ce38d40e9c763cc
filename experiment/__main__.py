"""``python -m experiment calibrate [--replicates R] [--resamples B] [--seed S] [--design D]
[--json]``: the lift procedures checked by simulation with a known truth (`experiment.calibration`)
in the committed LLM designs: bias, coverage, false verdicts under the null (unadjusted and with
Holm) and power, for the envelope procedure (`frontier.bootstrap_lift`) and the fitted-curve one
(`frontier.curve_lift`).

``python -m experiment publish STUDY_DIR DEST``: copy a study's small outputs (`study.json`,
`verdicts.md`, each stage's `lifts.md` and the confirmation's `frontier.png`) into DEST (e.g.
``figures/toy_study_sharpening``), to be committed.

``python -m experiment claims STUDY.json ... [--readme README.md]``: the claims table of the
studies' confirmation stages (`experiment.study.claims_table`, the rule in docs/statistics.md),
printed, or written into README.md between ``<!-- claims: begin -->`` and ``<!-- claims: end -->``.
"""

from __future__ import annotations

import argparse
import json
import sys

from experiment import calibration as C
from experiment import cli, store
from experiment import study as S

BEGIN, END = "<!-- claims: begin -->", "<!-- claims: end -->"

PROCEDURES = {
    "curve": C.curve_procedure,
    "envelope": C.bootstrap_procedure,
    "pooled": lambda resamples: C.curve_procedure(resamples, per_setting=False),
    "uncorrected": lambda resamples: C.curve_procedure(resamples, bias_correct=False),
    "edge": C.curve_procedure,  # kept as a name: its rule is in the tables' procedure now
    "no-edge": lambda resamples: C.curve_procedure(resamples, edge_z=0.0),
}
DEFAULT_PROCEDURES = ("curve", "envelope")
ALL_DESIGNS = C.DESIGNS | C.STRESS_DESIGNS


def _table(name: str, out: dict) -> str:
    lines = [
        f"{name}: {out['replicates']} simulated studies",
        "| true lift | bias (points) | sd | coverage | 'above' | 'below' | n (outside range) |",
        "|---|---|---|---|---|---|---|",
    ]
    for lift, r in out["by_lift"].items():
        lines.append(
            f"| +{lift} | {r['bias']:+.2f} ± {r['bias_se']:.2f} | {r['sd']:.2f} | "
            f"{r['coverage']:.3f} ± {r['coverage_se']:.3f} | {r['above']:.3f} | {r['below']:.3f} "
            f"| {r['n']} ({r['outside_range']}) |"
        )
    fw = out["familywise_null"]
    lines.append(f"family-wise false verdicts over a study's null models: above {fw['above']:.3f}, "
                 f"below {fw['below']:.3f} (unadjusted)")  # fmt: skip
    if "familywise_holm" in out:
        fw = out["familywise_holm"]
        lines.append(f"with Holm at 0.05: above {fw['above']:.3f}, below {fw['below']:.3f}")
    lines.append(f"MDE at 80% power ≈ {out['mde']:.2f} points")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: an error prints one line and returns 2
    (`experiment.cli.run`)."""
    return cli.run(_main, argv)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiment", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cal = sub.add_parser("calibrate", help="bias, coverage, false verdicts and power by simulation")
    cal.add_argument("--replicates", type=int, default=300, help="simulated studies (default 300)")
    cal.add_argument("--resamples", type=int, default=200,
                     help="bootstrap resamples per study (the envelope's interval; the curve's "
                          "inside fraction)")  # fmt: skip
    cal.add_argument("--seed", type=int, default=0, help="simulation seed")
    cal.add_argument("--procedure", choices=sorted(PROCEDURES), action="append",
                     help="procedure(s) to check (default: curve, the tables' maximum of "
                          "per-setting curves, bias-corrected, both sides tested at a drop (edge: the same), "
                          "and envelope; uncorrected: that maximum without the correction; "
                          "no-edge: without the drop rule; pooled: one curve for all settings)")  # fmt: skip
    cal.add_argument("--design", choices=sorted(ALL_DESIGNS), action="append",
                     help="design(s) to simulate (default: the committed ones, "
                          "`experiment.calibration.DESIGNS`; also its STRESS_DESIGNS)")  # fmt: skip
    cal.add_argument("--json", action="store_true", help="print JSON instead of tables")
    cl = sub.add_parser("claims", help="the claims table of committed studies (study.json files)")
    cl.add_argument("studies", nargs="+", help="study.json files (python -m toymdp study)")
    cl.add_argument("--readme", help="write the table into this file between the claims markers")
    pb = sub.add_parser("publish", help="copy a study's small outputs into a folder to commit")
    pb.add_argument("study_dir", help="a study's output folder (python -m toymdp|llm study)")
    pb.add_argument("dest", help="destination folder (e.g. figures/toy_study_sharpening)")
    args = parser.parse_args(argv)
    if args.command == "publish":
        for name in S.publish(args.study_dir, args.dest):
            print(name)
        return 0
    if args.command == "claims":
        return _claims(args.studies, args.readme)
    if args.replicates < 2 or args.resamples < 2:
        parser.error("--replicates and --resamples must be >= 2")
    report = {}
    for design in args.design or sorted(C.DESIGNS):
        for name in args.procedure or DEFAULT_PROCEDURES:
            out = C.calibrate(ALL_DESIGNS[design], PROCEDURES[name](args.resamples),
                              replicates=args.replicates, seed=args.seed)  # fmt: skip
            out["mde"] = C.minimum_detectable_lift(out)
            report[f"{design}/{name}"] = out
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n\n".join(_table(name, out) for name, out in report.items()))
    return 0


def _claims(paths: list[str], readme: str | None) -> int:
    rows = []
    for path in paths:
        doc = store.read_json(path)
        if not isinstance(doc, dict) or "claims" not in doc:
            raise ValueError(f"{path}: not a study.json (python -m toymdp study writes one)")
        rows.extend(doc["claims"])
    table = S.claims_table(rows)
    if readme is None:
        print(table, end="")
        return 0
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise ValueError(f"--readme: {readme} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    store.write_text(readme, f"{head}{BEGIN}\n{table}{END}{rest.split(END, 1)[1]}")
    print(f"wrote {len(rows)} claims into {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
