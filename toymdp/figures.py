"""Run the toy experiments, cache their results, draw their figures, write `summary.json`.

Results are cached in `OUT/.cache/NAME-{quick,full}-sSEED-HASH.npz`, where HASH covers the source of
`numerics/`, `theory/`, `shaping/` and `toymdp/` and the numeric settings (`numerics.tag()`): any code
change, or a run with ``SHARPENING_NUMERICS=native``, recomputes; an unchanged tree only re-plots.
`summary.json` holds only deterministic numbers (no timings), so the same seed gives a bit-identical
file; timings go to `OUT/timings.json`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import numerics
from experiment import store
from experiment.cli import progress_bar
from toymdp.engine import code_hash, jax_cache
from toymdp.experiments import EXPERIMENTS


def _to_arrays(results: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for key, value in results.items():
        arr = np.asarray(value)
        if arr.dtype == object:
            raise ValueError(f"result {key!r} is not a numeric or string array")
        out[key] = arr
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def make_figures(
    out: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    only: Sequence[str] | None = None,
    use_cache: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Run (or load) every selected experiment, plot it, and write `out/summary.json`.

    Returns:
        The summary dict written (experiment name -> its headline numbers); experiments not
        selected keep their previous entry if `summary.json` already exists.

    Raises:
        ValueError: an unknown experiment name (the message lists the known ones).
    """
    ordered = sorted(EXPERIMENTS.values(), key=lambda e: e.order)
    if only:
        unknown = [n for n in only if n not in EXPERIMENTS]
        if unknown:
            raise ValueError(f"unknown experiment(s) {unknown}; known: {[e.name for e in ordered]}")
        ordered = [e for e in ordered if e.name in only]
    out.mkdir(parents=True, exist_ok=True)
    cache = out / ".cache"
    cache.mkdir(exist_ok=True)
    tag = f"{'quick' if quick else 'full'}-s{seed}-{code_hash()}"
    summary_path = out / "summary.json"
    summary: dict[str, Any] = {}
    if only and summary_path.exists():
        summary = json.loads(summary_path.read_text()).get("experiments", {})
    timings: dict[str, dict[str, float]] = {}
    bar = progress_bar(len(ordered), "toy figures", "experiment", progress=progress)
    for exp in ordered:
        bar.set_postfix_str(exp.name)
        path = cache / f"{exp.name}-{tag}.npz"
        start = time.perf_counter()
        if use_cache and path.exists():
            with np.load(path) as data:
                results = {k: data[k] for k in data.files}
            cached = True
        else:
            with jax_cache(cache / "jax"):
                results = _to_arrays(exp.run(quick, seed))
            store.save_npz(path, results)
            cached = False
        ran = time.perf_counter()
        files = exp.plot(results, out)
        summary[exp.name] = {
            "title": exp.title,
            "figures": sorted(p.name for p in files),
            **_jsonable(exp.summary(results)),
        }
        timings[exp.name] = {
            "run_s": round(ran - start, 3),
            "plot_s": round(time.perf_counter() - ran, 3),
            "cached": cached,
        }
        bar.update()
    bar.close()
    doc = {
        "seed": seed,
        "quick": quick,
        "numerics": numerics.tag(),
        "experiments": dict(sorted(summary.items())),
    }
    store.write_text(summary_path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    store.write_text(out / "timings.json", json.dumps(timings, indent=2) + "\n")
    return doc
