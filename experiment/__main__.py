"""``python -m experiment calibrate [--replicates R] [--resamples B] [--seed S] [--json]``: the lift
procedures checked by simulation with a known truth (`experiment.calibration`) in the design of
the LLM sweep of `make reproduce`: bias, coverage, false verdicts under the null and power, for
the envelope procedure (`frontier.bootstrap_lift`) and the fitted-curve one (`frontier.curve_lift`).
"""

from __future__ import annotations

import argparse
import json
import sys

from experiment import calibration as C
from experiment import cli

PROCEDURES = {"curve": C.curve_procedure, "envelope": C.bootstrap_procedure}


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
                     help="procedure(s) to check (default: both)")  # fmt: skip
    cal.add_argument("--design", choices=sorted(C.DESIGNS), action="append",
                     help="design(s) to simulate (default: all; `experiment.calibration.DESIGNS`)")  # fmt: skip
    cal.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    if args.replicates < 2 or args.resamples < 2:
        parser.error("--replicates and --resamples must be >= 2")
    report = {}
    for design in args.design or sorted(C.DESIGNS):
        for name in args.procedure or sorted(PROCEDURES):
            out = C.calibrate(C.DESIGNS[design], PROCEDURES[name](args.resamples),
                              replicates=args.replicates, seed=args.seed)  # fmt: skip
            out["mde"] = C.minimum_detectable_lift(out)
            report[f"{design}/{name}"] = out
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n\n".join(_table(name, out) for name, out in report.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
