"""The toy leg's command line:

    python -m toymdp figures [--out DIR] [--quick] [--seed S] [--only NAME ...] [--no-cache]
                             [--pdf] [--list]
    python -m toymdp sweep --config FILE [--out DIR] [--no-cache] [--set KEY=VALUE ...]
                           [--import MODULE ...]
    python -m toymdp study --config FILE [--out DIR]        # explore, pick, confirm
    python -m toymdp study --extend STUDY_DIR --methods FILE [--import MODULE ...] [--out DIR]
                           [--retrain-reference]
                           # new methods against a committed study's reference (GRPO not re-trained)
    python -m toymdp study --complete STUDY_DIR [--out DIR] # train a re-read's pending picks

`figures` regenerates every toy and theory figure into DIR (default `figures/`) as PNG (`--pdf`
also writes PDF), and writes `DIR/summary.json` with each experiment's headline numbers (mean and
spread over seeds).
`sweep` runs a hyper-parameter sweep from a TOML file (`toymdp.sweep`, examples in
`configs/toy/`) and writes `results.json`, `frontier.png` and `lifts.md` into DIR (default
`runs/toy_sweep/<config stem>`); `--set` overrides the file's keys (``seeds=[0] train.lr=0.05``,
TOML literals), as `python -m llm sweep --set` does. `study` runs a two-stage study
(`toymdp.study`, `configs/toy/study_*.toml`) or extends a committed one (`toymdp.extend`) and
writes study.json and verdicts.md. Progress goes to stderr: a bar on a terminal, a line per
compiled program in a log. An error prints one line, ``error: ...``, and exits 2; `--debug`
anywhere on the command line shows its traceback instead.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from experiment import cli
from experiment.extend import describe as describe_extension
from experiment.lock import check_folder
from shaping import import_methods
from toymdp.experiments import EXPERIMENTS, _plot
from toymdp.extend import complete_study, extend_study
from toymdp.figures import make_figures
from toymdp.study import run_study
from toymdp.sweep import sweep
from toymdp.sweep_spec import describe


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toymdp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fig = sub.add_parser("figures", help="regenerate every toy figure and summary.json")
    fig.add_argument(
        "--out", type=Path, default=Path("figures"), help="output folder (default figures/)"
    )
    fig.add_argument("--quick", action="store_true", help="tiny budgets (for CI and smoke tests)")
    fig.add_argument("--seed", type=cli.seed_value, default=0, help="random seed (default 0)")
    fig.add_argument("--only", nargs="+", metavar="NAME", help="run only these experiments")
    fig.add_argument(
        "--no-cache", action="store_true", help="recompute even if cached results exist"
    )
    fig.add_argument("--list", action="store_true", help="list the experiments and exit")
    fig.add_argument("--pdf", action="store_true", help="also write each figure as PDF")
    sw = sub.add_parser("sweep", help="hyper-parameter sweep: results.json, frontier, lift table")
    sw.add_argument("--config", type=Path, help="sweep TOML (see configs/toy/ and --describe)")
    sw.add_argument("--describe", action="store_true", help="print every sweep key and exit")
    sw.add_argument(
        "--out", type=Path, default=None, help="output folder (default runs/toy_sweep/<stem>)"
    )
    sw.add_argument(
        "--no-cache", action="store_true", help="recompute even if cached results exist"
    )
    cli.add_set_argument(sw, "override sweep keys: seeds=[0] train.lr=0.05 (TOML literals)")
    cli.add_import_argument(sw)
    st = sub.add_parser("study", help="two-stage study: explore, pick, confirm, verdicts")
    st.add_argument("--config", type=Path,
                    help="study TOML: a sweep file plus [study] (configs/toy/study_*.toml)")  # fmt: skip
    cli.extend_arguments(st, "figures/toy_study_sharpening", "runs/toy_extend/<study folder>")
    st.add_argument(
        "--out", type=Path, default=None,
        help="output folder (default runs/toy_study/<stem>, or runs/toy_extend/<study folder>)",
    )  # fmt: skip
    st.add_argument(
        "--no-cache", action="store_true", help="recompute even if cached results exist"
    )
    args = parser.parse_args(argv)
    if args.command == "sweep":
        return _sweep(args)
    if args.command == "study":
        return _study(args)

    if args.list:
        for exp in sorted(EXPERIMENTS.values(), key=lambda e: e.order):
            print(f"{exp.order}. {exp.name:<14} {exp.title}")
        return 0
    unknown = [n for n in args.only or [] if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"--only: unknown experiment(s) {unknown}; known: {sorted(EXPERIMENTS)}")
    if args.pdf:
        _plot.FORMATS = ["png", "pdf"]
    start = time.perf_counter()
    doc = make_figures(
        check_folder(args.out),
        quick=args.quick,
        seed=args.seed,
        only=args.only,
        use_cache=not args.no_cache,
        progress=True,
    )
    elapsed = time.perf_counter() - start
    print(
        f"wrote {len(doc['experiments'])} experiments to {args.out}/ (summary.json) in {elapsed:.1f} s"
    )
    return 0


def _study(args: argparse.Namespace) -> int:
    if cli.completing(args):
        result = complete_study(args.complete, args.out, use_cache=not args.no_cache,
                                progress=True)  # fmt: skip
        cli.print_claims(result)
        out = args.out or Path("runs/toy_complete") / args.complete.name
        print(f"wrote study.json and verdicts.md to {out}/")
        return 0
    if cli.extending(args):
        result = extend_study(args.extend, args.methods, args.out, retrain=args.retrain_reference,
                              use_cache=not args.no_cache, progress=True,
                              imports=args.imports)  # fmt: skip
        out = args.out or Path("runs/toy_extend") / args.extend.name
        print(describe_extension(result))
        print(f"wrote study.json and verdicts.md to {out}/")
        return 0
    result = run_study(args.config, args.out, use_cache=not args.no_cache, progress=True)
    cli.print_claims(result)
    out = args.out or Path("runs/toy_study") / args.config.stem
    print(f"wrote study.json and verdicts.md to {out}/")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    if args.describe:
        print(describe())
        return 0
    if args.config is None:
        raise ValueError("sweep: --config FILE is required (see --describe)")
    cli.require_file(args.config, "--config")
    import_methods(args.imports)
    result = sweep(args.config, args.out, use_cache=not args.no_cache,
                   progress=True, sets=args.sets)  # fmt: skip
    runs = len(result["doc"]["runs"])
    how = "loaded from cache" if result["cached"] else "trained"
    print(
        f"{runs} runs {how} in {result['run_s']:.1f} s; wrote results.json, frontier.png and "
        f"lifts.md to {result['out']}/"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: an error prints one line to stderr and returns 2
    (``--debug`` anywhere in `argv` lets it propagate with its traceback)."""
    return cli.run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
