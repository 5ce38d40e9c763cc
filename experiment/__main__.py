"""``python -m experiment calibrate [--replicates R] [--draws B] [--seed S] [--design D]
[--design-file JSON] [--set FIELD=VALUE] [--size] [--json]``:
the whole study pipeline (explore, pick, confirm, Holm, the claim rule) checked by simulation with
a known truth in every design of `experiment.calibration.DESIGNS`: the exploratory lifts' range
and coverage, the probability of picking the best setting, the confirmed lifts' bias and
coverage, family-wise false verdicts with Holm, power and the rate of each claim word;
``--set explore_seeds=6`` calibrates a copy of each design with that field changed (what a
design needs to reach a target); ``--design-file my_study.json`` simulates a design of the
user's own, a JSON object of `Design` fields (`experiment.calibration.design_from_fields`);
``--size`` calibrates each design at growing seeds until it holds the calibration's targets
(`experiment.calibration.size_for`: exploration seeds for the best-setting share, then
confirmation seeds) and prints each size tried, what it misses, and the first size that misses
nothing.
``python -m experiment calibrate --summary docs/calibration.json``: the one table of every design
docs/statistics.md shows, from a saved ``--json`` output (nothing simulated).

``python -m experiment fit-design RESULTS.json [--label grpo] [--steps 40,80,120]``: a calibration
design fitted to a sweep's per-problem counts (`experiment.fit`), printed as JSON: the fields of
`experiment.calibration.Design`, which ``calibrate --design-file`` reads (saved to a file).

``python -m experiment publish STUDY_DIR DEST``: copy a study's small outputs (`study.json`,
`verdicts.md`, each stage's `lifts.md`, `frontier.png` and `lift_inputs.npz`) into DEST (e.g.
``figures/toy_study_sharpening``), to be committed (`experiment.reread.publish`): DEST holds one
study; a DEST that holds another is refused, naming both.

``python -m experiment reread STUDY_DIR [--out DIR]``: re-read a published study (or a study's
output folder) with the procedure in force, from its lift inputs, nothing re-trained
(`experiment.reread`): picks again, concludes again, rewrites study.json, verdicts.md and the lift
tables and figures in STUDY_DIR (or DIR, with the lift inputs: DIR re-reads on its own; a DIR that
holds another study is refused); prints each claim's word, and the word it replaces where it
changed; a pick whose setting the confirmation did not train is listed as pending (``python -m
llm study --complete STUDY_DIR``, or the toy's, trains it and reads the study again). Lift inputs that are not the ones study.json records
(their digest, ``inputs_sha256``) are refused by name.

``python -m experiment upgrade STUDY_DIR ...``: record the lift inputs' digest in a study.json
written before studies recorded it (`experiment.reread.upgrade`; once: a study.json that has it is
checked instead). Nothing else changes.

``python -m experiment claims STUDY.json ... [--readme README.md] [--results docs/results.md]
[--compact]``: the claims table of the studies' confirmation stages
(`experiment.study_report.claims_table`, the rule in docs/statistics.md), printed (``--compact``:
each cell the word and the lift), or written between ``<!-- claims: begin -->`` and
``<!-- claims: end -->``: compact into README.md (``--readme``), in full (the intervals and MDEs)
into docs/results.md (``--results``).
A study.json written with the words before the five reads in the five (`experiment.study.translate`;
its column names its procedure).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiment import calibration as C
from experiment import cli, fit, reread, store
from experiment import study as S
from experiment import study_report as R
from experiment.inference import PROCEDURE

BEGIN, END = "<!-- claims: begin -->", "<!-- claims: end -->"
SUPERSEDED = "lift v2, unequal budgets: superseded, to be re-run"
"""The claims table's mark of a study.json without a ``procedure`` (docs/statistics.md)."""


def _table(name: str, out: dict) -> str:
    e, fw = out["explore"], out["familywise"]
    rules = "; ".join(
        f"{rule}: best setting {r['best_picked'].get('plus5', float('nan')):.2f}, plus5's pick "
        f"{r['truth']['plus5']:+.2f} points"
        for rule, r in e["rules"].items()
    )
    lines = [
        f"{name}: {out['replicates']} simulated studies; exploration: largest |lift| "
        f"{e['max_abs_lift']:.1f} points, coverage {e['coverage']:.3f}, best setting picked "
        f"{e['best_picked']:.2f} (rule {out['rule']}; {rules}); Holm family-wise false 'above' "
        f"{fw['above']:.3f} ± {fw['above_se']:.3f}, 'below' {fw['below']:.3f} ± "
        f"{fw['below_se']:.3f} over the nulls {', '.join(fw['nulls'])}",
        "| method | pick's true lift (points) | bias | coverage | > 0 after Holm | words | outside |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in out["confirm"].items():
        words = ", ".join(f"{w} {v:.2f}" for w, v in r["words"].items())
        lines.append(
            f"| {label} | {r['truth']:+.2f} | {r['bias']:+.2f} ± {r['bias_se']:.2f} | "
            f"{r['coverage']:.3f} ± {r['coverage_se']:.3f} | {r['supported']:.2f} | "
            f"{words} | {r['outside']:.2f} |"
        )
    return "\n".join(lines)


def _size_table(name: str, d: C.Design, out: dict) -> str:
    lines = [
        f"{name}: {out['replicates']} simulated studies per size ({d.problems} problems explored, "
        f"{d.confirm_problems} confirmed)",
        "| seeds: exploration × confirmation | best setting picked | coverage (every method) | "
        "largest \\|bias\\| (points) | family-wise false 'above' / 'below' | misses |",
        "|---|---|---|---|---|---|",
    ]
    for t in out["trials"]:
        lo, hi = t["coverage"]
        above, below = t["familywise"]
        lines.append(
            f"| {t['explore_seeds']} × {t['confirm_seeds']} | {t['best_picked']:.2f} | "
            f"{lo:.3f}-{hi:.3f} | {t['max_abs_bias']:.2f} | {above:.3f} / {below:.3f} | "
            f"{', '.join(t['misses']) or '—'} |"
        )
    size = out["size"]
    if size is None:
        left = ", ".join(out["trials"][-1]["misses"])
        lines.append(f"No size tried holds every target: {left} at the largest (more seeds did "
                     "not remove it).")  # fmt: skip
    else:
        lines.append(f"Holds every target at {size['explore_seeds']} exploration × "
                     f"{size['confirm_seeds']} confirmation seeds.")  # fmt: skip
    return "\n".join(lines)


SHORT_WORDS = {"supported": "sup", "smaller than claimed": "smaller", "not better than GRPO":
               "not better", "below GRPO": "below", "not resolved": "n.r."}  # fmt: skip
"""The claim words as the summary table abbreviates them (`experiment.study.claim_verdicts`)."""


def summary_table(doc: dict) -> str:
    """The markdown table of every design of a saved ``calibrate --json`` output `doc` (one row
    per simulated method, the design's exploration and family-wise figures on its first row),
    as docs/statistics.md shows it.

    Raises:
        ValueError: `doc` is not a ``calibrate --json`` output (naming the missing key).
    """
    lines = [
        "| design | exploration: largest \\|lift\\|, coverage | best setting picked | Holm false "
        "'above' / 'below' (nulls) | method: pick's true lift | bias (points) | coverage | "
        "> 0 after Holm | words |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, out in doc.items():
        try:
            e, fw, confirm = out["explore"], out["familywise"], out["confirm"]
            head = (f"| {name} | {e['max_abs_lift']:.1f}, {e['coverage']:.3f} | "
                    f"{e['best_picked']:.2f} | {fw['above']:.3f} / {fw['below']:.3f} "
                    f"({len(fw['nulls'])}) |")  # fmt: skip
            for i, (label, r) in enumerate(confirm.items()):
                words = ", ".join(f"{SHORT_WORDS.get(w, w)} {v:.2f}"
                                  for w, v in sorted(r["words"].items()))  # fmt: skip
                lines.append(
                    (head if i == 0 else "| | | | |")
                    + f" {label}: {r['truth']:+.2f} | {r['bias']:+.2f} ± {r['bias_se']:.2f} | "
                    f"{r['coverage']:.3f} | {r['supported']:.2f} | {words} |"
                )
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(
                f"design {name!r}: not a calibrate --json output (missing {err})"
            ) from None
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: an error prints one line and returns 2
    (`experiment.cli.run`)."""
    return cli.run(_main, argv)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiment", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cal = sub.add_parser("calibrate", help="bias, coverage, false verdicts and power by simulation")
    cal.add_argument("--replicates", type=int, default=200, help="simulated studies (default 200)")
    cal.add_argument("--draws", type=int, default=300,
                     help="draws of the means per analysis (default 300)")  # fmt: skip
    cal.add_argument("--seed", type=cli.seed_value, default=0, help="simulation seed")
    cal.add_argument("--design", choices=sorted(C.DESIGNS), action="append",
                     help="design(s) to simulate (default: every design of "
                          "`experiment.calibration.DESIGNS`)")  # fmt: skip
    cal.add_argument("--design-file", action="append", default=[], metavar="JSON",
                     help="also simulate this design, named by the file's stem: a JSON object "
                          "of Design fields (fit-design's output; the others at their defaults); "
                          "repeatable; without --design, only the files' designs")  # fmt: skip
    cal.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                     help="change a field of every simulated design, e.g. explore_seeds=6 "
                          "(`experiment.calibration.override`; repeatable)")  # fmt: skip
    cal.add_argument("--size", action="store_true",
                     help="calibrate each design at growing exploration, then confirmation, "
                          "seeds until it holds the targets (`experiment.calibration.size_for`); "
                          "print each size and what it misses")  # fmt: skip
    cal.add_argument("--json", action="store_true", help="print JSON instead of tables")
    cal.add_argument("--summary", metavar="JSON",
                     help="print the one table of every design from a saved --json output "
                          "(docs/calibration.json); nothing is simulated")  # fmt: skip
    cl = sub.add_parser("claims", help="the claims table of committed studies (study.json files)")
    cl.add_argument("studies", nargs="+", help="study.json files (python -m toymdp study)")
    cl.add_argument("--readme", help="write the compact table into this file between the markers")
    cl.add_argument("--results", help="write the full table into this file between the markers")
    cl.add_argument("--compact", action="store_true", help="print each cell's word and lift only")
    fd = sub.add_parser("fit-design", help="a calibration design fitted to a sweep's counts")
    fd.add_argument("results", help="a sweep's results.json (python -m llm sweep | study)")
    fd.add_argument("--label", default="grpo", help="the reference's label (default grpo)")
    fd.add_argument("--steps", help="checkpoint steps to fit, comma-separated (default: all)")
    pb = sub.add_parser("publish", help="copy a study's small outputs into a folder to commit")
    pb.add_argument("study_dir", help="a study's output folder (python -m toymdp|llm study)")
    pb.add_argument("dest", help="destination folder (e.g. figures/toy_study_sharpening)")
    rr = sub.add_parser("reread", help="re-read a study with the procedure in force, no training")
    rr.add_argument("study_dir", help="a published study folder (figures/...) or a study's output")
    rr.add_argument("--out", help="write there instead of STUDY_DIR")
    up = sub.add_parser("upgrade", help="record the lift inputs' digest in older study.json files")
    up.add_argument("study_dirs", nargs="+", help="published study folders (figures/...)")
    args = parser.parse_args(argv)
    if args.command == "upgrade":
        for folder in args.study_dirs:
            done = reread.upgrade(folder)
            print(f"{folder}: " + ("recorded inputs_sha256" if done else "inputs_sha256 checked"))
        return 0
    if args.command == "reread":
        return _reread(args.study_dir, args.out)
    if args.command == "publish":
        for name in reread.publish(args.study_dir, args.dest):
            print(name)
        return 0
    if args.command == "claims":
        return _claims(args.studies, args.readme, args.results, args.compact)
    if args.command == "fit-design":
        return _fit_design(args.results, args.label, args.steps)
    if args.summary is not None:
        if args.set:
            parser.error("--set changes a simulated design; --summary simulates nothing")
        doc = _read_json(args.summary, "--summary")
        if not isinstance(doc, dict):
            raise ValueError(f"--summary: {args.summary} is not a calibrate --json output")
        print(summary_table(doc), end="")
        return 0
    if args.replicates < 2 or args.draws < 20:
        parser.error("--replicates must be >= 2 and --draws >= 20")
    builtin = args.design or ([] if args.design_file else list(C.DESIGNS))
    designs = {name: C.DESIGNS[name] for name in builtin}
    for file in args.design_file:
        name = Path(file).stem
        if name in designs:
            parser.error(f"--design-file {file}: its name {name!r} is already a design to "
                         "simulate; rename the file")  # fmt: skip
        designs[name] = C.design_from_fields(_read_json(file, "--design-file"), file)
    designs = {name: C.override(d, args.set) for name, d in designs.items()}
    if args.size:
        sizes = {name: C.size_for(d, replicates=args.replicates, seed=args.seed, draws=args.draws,
                                  progress=name)
                 for name, d in designs.items()}  # fmt: skip
        print(
            json.dumps(sizes, indent=2)
            if args.json
            else "\n\n".join(_size_table(name, designs[name], out) for name, out in sizes.items())
        )
        return 0
    report = {name: C.calibrate(d, replicates=args.replicates, seed=args.seed, draws=args.draws,
                                progress=name)
              for name, d in designs.items()}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n\n".join(_table(name, out) for name, out in report.items()))
    return 0


def _read_json(path: str, what: str) -> object:
    """The JSON file `path` a command line gave as `what` (an option's or argument's name).

    Raises:
        FileNotFoundError: no such file. ValueError: not JSON text (both naming `what` and the file).
    """
    doc = store.read_json(cli.require_file(path, what))
    if doc is None:
        raise ValueError(f"{what}: {path} is not JSON text")
    return doc


def _fit_design(path: str, label: str, steps: str | None) -> int:
    base, n, runs = fit.counts_from_results(_read_json(path, "results"), label)
    if steps is not None:
        try:
            keep = [int(v) for v in steps.split(",")]
        except ValueError:
            raise ValueError(f"--steps: expected comma-separated integers, got {steps!r}") from None
        have = sorted(next(iter(runs.values())))
        if not set(keep) <= set(have):
            raise ValueError(f"--steps: {sorted(set(keep) - set(have))} not among {have}")
        runs = {st: {k: by[k] for k in keep} for st, by in runs.items()}
    print(json.dumps(fit.describe_fit(fit.fit_design(base, n, runs), list(runs)), indent=2))
    return 0


def _reread(study_dir: str, out: str | None) -> int:
    result = reread.reread(study_dir, out)
    before = result["reread"]["from"]
    same = before == result["procedure"]
    print(f"{result['study']}: re-read by {result['procedure']} "
          + ("(the procedure it was read by)" if same else f"(was {before})"))  # fmt: skip
    was = {r["claim"]: r["verdict"] for r in result["reread"].get("claims_were", [])}
    for row in result["claims"]:
        if row["verdict"]:
            old = was.get(row["claim"], row["verdict"])
            print(f"  {row['claim']}: {row['verdict']}" + (f" (was {old})" if old != row["verdict"]
                                                            else ""))  # fmt: skip
    for label, p in result.get("pending", {}).items():
        print(f"  {label}: pick {p['setting']} step {p['step']} not trained in the confirmation")
    return 0


def _claims(paths: list[str], readme: str | None, results: str | None = None,
            compact: bool = False) -> int:  # fmt: skip
    rows = []
    for path in paths:
        doc = _read_json(path, "studies")
        if not isinstance(doc, dict) or "claims" not in doc:
            raise ValueError(f"{path}: not a study.json (python -m toymdp study writes one)")
        try:
            # the five words, whatever words it was written with; its picks left pending by a
            # re-read (not trained in its confirmation) as such
            claims = S.translate(doc) + S.pending_rows(doc)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"{path}: claims: {e}") from None
        if "procedure" not in doc:  # read by lift v2, before equal budgets
            tag = f"{doc.get('study', path)} ({SUPERSEDED})"
            rows.extend({**r, "study": tag} for r in claims)
        elif doc["procedure"] != PROCEDURE:  # an earlier lift: its column says which
            tag = f"{doc.get('study', path)} ({doc['procedure'].split(':')[0]})"
            rows.extend({**r, "study": tag} for r in claims)
        else:
            rows.extend(claims)
    if readme is None and results is None:
        print(R.claims_table(rows, compact=compact), end="")
        return 0
    targets = [("--readme", readme, True), ("--results", results, False)]
    texts = {}
    for flag, path, _ in targets:  # every target checked before any is written
        if path is not None:
            texts[flag] = cli.require_file(path, flag).read_text(encoding="utf-8")
            if BEGIN not in texts[flag] or END not in texts[flag]:
                raise ValueError(f"{flag}: {path} has no {BEGIN} ... {END} markers")
    for flag, path, short in targets:
        if path is not None:
            head, rest = texts[flag].split(BEGIN, 1)
            table = R.claims_table(rows, compact=short)
            store.write_text(path, f"{head}{BEGIN}\n{table}{END}{rest.split(END, 1)[1]}")
            print(f"wrote {len(rows)} claims into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
