"""`python -m theory check [--trials N] [--seed S] [--json] [--out FILE] [--only NAME ...] [--list]`.

Runs every theorem checker on random instances, prints a table (or JSON), and exits 1 if any claim
the project documents as holding is violated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numerics
from theory.checks import CHECKERS, run_checks


def _table(rows: list[dict]) -> str:
    name_w = max([len("checker"), *(len(r["name"]) for r in rows)])
    src_w = max([len("source"), *(len(r["source"]) for r in rows)])
    head = (
        f"{'checker':<{name_w}}  {'source':<{src_w}}  {'status':<14} {'trials':>6} {'viol.':>5}"
        f" {'max residual':>12}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['name']:<{name_w}}  {r['source']:<{src_w}}  {r['status']:<14} {r['trials']:>6} "
            f"{r['violations']:>5} {r['max_residual']:>12.2e}"
        )
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m theory", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check every theorem numerically on random instances")
    check.add_argument(
        "--trials",
        type=int,
        default=None,
        help="instances per checker (default: each checker's own)",
    )
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    check.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    check.add_argument("--out", metavar="FILE", help="also write the JSON rows to FILE")
    check.add_argument("--only", nargs="+", metavar="NAME", help="run only these checkers")
    check.add_argument("--list", action="store_true", help="list the checkers and exit")
    args = parser.parse_args(argv)

    if args.list:
        for name, chk in CHECKERS.items():
            print(f"{name:<28} {chk.source:<34} {chk.claim}")
        return 0
    if args.trials is not None and args.trials < 1:
        parser.error(f"--trials must be >= 1, got {args.trials}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    unknown = [n for n in args.only or [] if n not in CHECKERS]
    if unknown:
        parser.error(f"unknown checker(s) {unknown}; known: {sorted(CHECKERS)}")
    start = time.perf_counter()
    rows = run_checks(
        args.only, args.trials, args.seed, progress=not args.json and sys.stderr.isatty()
    )
    elapsed = time.perf_counter() - start
    for row in rows:
        row["numerics"] = numerics.tag()  # "native (...)": not byte-comparable across machines
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        # 9 significant digits: the file is tracked (its bytes are pinned by `numerics`, which
        # also fixes OpenBLAS's thread split); the rounding keeps it readable.
        tmp.write_text(json.dumps(_rounded(rows), indent=2) + "\n")
        tmp.replace(out)  # atomic: a reader never sees a half-written file
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_table(rows))
        found = [r["name"] for r in rows if r["status"] == "counterexample"]
        bad = [r["name"] for r in rows if r["violations"]]
        print(
            f"\n{len(rows)} checkers in {elapsed:.1f} s; counterexamples (documented findings): "
            f"{found or 'none'}; violations: {bad or 'none'}"
        )
    return 1 if any(r["violations"] for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: an error prints one line to stderr and returns 2
    (``--debug`` anywhere in `argv` lets it propagate with its traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        return _main([a for a in argv if a != "--debug"])
    except Exception as e:
        if debug:
            raise
        text = " ".join(str(e).split())
        what = (
            text if isinstance(e, ValueError | OSError) and text else f"{type(e).__name__}: {text}"
        )
        print(f"error: {what} (--debug shows the traceback)", file=sys.stderr)
        return 2


def _rounded(value: object, digits: int = 9) -> object:
    """`value` with every float rounded to `digits` significant digits (containers recursed)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v, digits) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
