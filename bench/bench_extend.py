"""Time to a verdict for a new method (issue 55): `extend` against a full study, side by side.

    python bench/bench_extend.py --leg toy [--out bench/results/extend_toy.json]
    python bench/bench_extend.py --leg llm [--skip-full] [--workers 2]

For one leg, on the committed study (toy: figures/toy_study_sharpening; LLM:
figures/llm_study_countdown_rule) and the methods file (default examples/my_methods.toml with
examples/my_methods.py imported: a method the package does not have), times in fresh output
folders (no cache):

- **extend**: ``python -m <leg> study --extend STUDY --methods FILE --import MODULE``;
- **full**: the same with ``--retrain-reference``: GRPO's exploration and confirmation re-trained
  beside the method, the runs of a full study of the committed file cut to GRPO and the method
  (what a user would run without `extend`; its picks evaluated at their checkpoint alone, as the
  extension's, so the full study here is, if anything, cheaper than ``study --config``).

Each command runs as its own process (start-up and compilation included). Prints both wall
times and their ratio, and writes them with the machine, the phases of the extension (the trust
check, exploration, confirmation and reading, from its folder's file times) and both verdicts to
`--out` (default bench/results/extend_<leg>.json). A methods file whose labels the committed study
also has re-derives them: the output compares each one's pick, confirmation gains and confirmed
lift with the committed ones (``rederived``). Nothing else should run beside it.
"""

from __future__ import annotations

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy loads)

# isort: split
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from experiment import reread
from experiment import study_report as R

ROOT = Path(__file__).resolve().parents[1]
STUDIES = {"toy": "figures/toy_study_sharpening", "llm": "figures/llm_study_countdown_rule"}


def _run(argv: list[str], log: Path) -> float:
    start = time.perf_counter()
    with log.open("w") as f:
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}); see {log}")
    return seconds


def _phases(out: Path) -> dict[str, float]:
    """Seconds of each phase of an extension from the modification times of what it wrote."""
    marks = {"trust": out / "trust.json", "explore": out / "explore",
             "confirm": out / "confirm", "read": out / "study.json"}  # fmt: skip
    times = {k: max((p.stat().st_mtime for p in v.rglob("*")), default=v.stat().st_mtime)
             if v.is_dir() else v.stat().st_mtime for k, v in marks.items() if v.exists()}  # fmt: skip
    return times


def rederived(study: Path, ext: Path) -> dict[str, dict]:
    """For each extension label the committed study also has (a committed method re-derived):
    whether the pick (setting, checkpoint) and the confirmation's gains at it are the committed
    ones, and the committed and re-derived confirmed lift (points) and Holm p."""
    committed, mine = (json.loads((d / "study.json").read_text()) for d in (study, ext))
    theirs_in = reread.load_inputs(study / f"confirm_{reread.INPUTS}")["measures"]["pass_at_k"]
    mine_in = reread.load_inputs(ext / f"confirm_{reread.INPUTS}")["measures"]["pass_at_k"]
    out = {}
    for label, p in mine["picks"]["pass_at_k"].items():
        q = committed["picks"]["pass_at_k"].get(label)
        if q is None:
            continue
        same_pick = (p["setting"], p["step"]) == (q["setting"], q["step"])

        def gains(a: dict, label: str = label, step: int = p["step"]) -> np.ndarray | None:
            i = [j for j in a["models"].select(label) if a["models"].step[j] == step]
            return np.stack([a["x"][i[0]], a["y"][i[0]]]) if i else None

        g, h = gains(mine_in), gains(theirs_in)
        c, e = (d["confirmed"]["pass_at_k"][label] for d in (committed, mine))
        out[label] = {"same_pick": same_pick, "pick": [p["setting"], p["step"]],
                      "committed_pick": [q["setting"], q["step"]],
                      "same_confirmation_gains": bool(g is not None and h is not None
                                                      and np.array_equal(g, h)),
                      "lift_points": {"committed": 100 * c["lift"] if c["lift"] is not None
                                      else None,
                                      "extension": 100 * e["lift"] if e["lift"] is not None
                                      else None},
                      "se_points": {"committed": 100 * c["se"] if c["se"] else None,
                                    "extension": 100 * e["se"] if e["se"] else None},
                      "p_holm": {"committed": c["p_holm"], "extension": e["p_holm"]}}  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leg", choices=sorted(STUDIES), required=True)
    parser.add_argument("--methods", type=Path, default=ROOT / "examples" / "my_methods.toml")
    parser.add_argument("--import", dest="module", default="examples/my_methods.py")
    parser.add_argument("--workers", type=int, default=2, help="LLM leg: worker processes")
    parser.add_argument("--skip-full", action="store_true", help="time the extension alone")
    parser.add_argument("--full-only", action="store_true",
                        help="time the full study alone, beside the extension's time in --out")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    study = ROOT / STUDIES[args.leg]
    work = Path(tempfile.mkdtemp(prefix=f"bench_extend_{args.leg}_"))
    extra = ["--workers", str(args.workers)] if args.leg == "llm" else []
    ext_out = work / "extend"
    argv = ["-m", "llm" if args.leg == "llm" else "toymdp", "study", "--extend", str(study),
            "--methods", str(args.methods), "--import", args.module, *extra, "--out"]  # fmt: skip
    out = args.out or ROOT / "bench" / "results" / f"extend_{args.leg}.json"
    if args.full_only:
        result = json.loads(out.read_text())
        t_ext = result["extend_seconds"]
    else:
        start, load = time.time(), os.getloadavg()
        t_ext = _run([*argv, str(ext_out)], work / "extend.log")
        phases = {k: round(v - start, 1) for k, v in _phases(ext_out).items()}
        result = {"leg": args.leg, "study": STUDIES[args.leg], "methods": str(args.methods),
                  "machine": {"cpu": R.cpu_model(), "cpu_id": R.cpu_id(), "cores": os.cpu_count(),
                              "load_average_before": load},
                  "extend_seconds": round(t_ext, 1), "extend_phases_end_seconds": phases,
                  "extend_verdicts": json.loads((ext_out / "study.json").read_text())["claims"],
                  "rederived": rederived(study, ext_out)}  # fmt: skip
        print(f"extend: {t_ext:.0f} s (phases end at {phases})")
        for label, r in result["rederived"].items():
            print(f"re-derived {label}: {r}")
    if not args.skip_full:
        t_full = _run([*argv, str(work / "full"), "--retrain-reference"], work / "full.log")
        result["full_seconds"] = round(t_full, 1)
        result["ratio"] = round(t_ext / t_full, 3)
        print(f"full study (GRPO re-trained beside the methods): {t_full:.0f} s; extend / full = "
              f"{t_ext / t_full:.2f}")  # fmt: skip
    result["machine"]["load_average_after"] = os.getloadavg()
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
