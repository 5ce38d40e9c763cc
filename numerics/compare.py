"""`python -m numerics.compare [PATH ...]`: are the outputs under PATH (default ``figures``) the
committed ones? The last step of `make reproduce`.

Prints ``identical to the committed results`` and exits 0, or lists each file that differs from
git's ``HEAD`` (or is new) with how much: for JSON the largest difference of a reported number and
where it is, for text (Markdown tables) the largest difference among the numbers of the changed
lines, for anything else that its bytes differ; then exits 1. Outside a git checkout it says so
and exits 0 (nothing to compare with).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_NUMBER = re.compile(r"[-+−]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def changed_files(paths: list[str]) -> list[str]:
    """Tracked files under `paths` that differ from ``HEAD``, then untracked non-ignored ones.

    Raises:
        subprocess.CalledProcessError: not a git checkout.
    """
    modified = _git("diff", "--name-only", "HEAD", "--", *paths).split()
    new = _git("ls-files", "--others", "--exclude-standard", "--", *paths).split()
    return sorted(set(modified)) + sorted(set(new) - set(modified))


def _leaves(doc: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, doc


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def json_difference(old: Any, new: Any) -> dict[str, Any]:
    """``{"numbers": k, "largest": d, "at": key path, "other": m}``: k numbers differ, the largest
    by d (absolute), at that key path; m other leaves (strings, added or removed keys) differ."""
    a, b = dict(_leaves(old)), dict(_leaves(new))
    numbers, other, largest, at = 0, 0, 0.0, ""
    for key in a.keys() | b.keys():
        x, y = a.get(key), b.get(key)
        if key in a and key in b and _is_number(x) and _is_number(y):
            if x != y:
                numbers += 1
                d = abs(float(x) - float(y)) if math.isfinite(x) and math.isfinite(y) else math.inf
                if d >= largest:
                    largest, at = d, key
        elif x != y or (key in a) != (key in b):
            other += 1
    return {"numbers": numbers, "largest": largest, "at": at, "other": other}


def text_difference(old: str, new: str) -> dict[str, Any]:
    """``{"lines": k, "largest": d}``: k lines differ; d is the largest difference between the
    numbers at the same place of a changed line (lines of other shape count only in k)."""
    a, b = old.splitlines(), new.splitlines()
    lines = sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))
    largest = 0.0
    for x, y in zip(a, b, strict=False):
        if x == y:
            continue
        nx = [float(s.replace("−", "-")) for s in _NUMBER.findall(x)]
        ny = [float(s.replace("−", "-")) for s in _NUMBER.findall(y)]
        if len(nx) == len(ny):
            largest = max([largest, *(abs(p - q) for p, q in zip(nx, ny, strict=True))])
    return {"lines": lines, "largest": largest}


def describe(path: str) -> str:
    """One line saying how `path` differs from its committed version."""
    try:
        committed = subprocess.run(
            ["git", "show", f"HEAD:{path}"], capture_output=True, check=True
        ).stdout
    except subprocess.CalledProcessError:
        return f"{path}: new (not committed)"
    p = Path(path)
    if not p.exists():
        return f"{path}: missing (committed, not written)"
    current = p.read_bytes()
    if p.suffix == ".json":
        try:
            d = json_difference(json.loads(committed), json.loads(current))
        except ValueError:
            return f"{path}: differs (not valid JSON)"
        return (
            f"{path}: {d['numbers']} numbers differ, largest by {d['largest']:.3g}"
            f" (at {d['at'] or '-'}); {d['other']} other fields differ"
        )
    if p.suffix in (".md", ".txt", ".csv", ".toml"):
        d = text_difference(committed.decode(errors="replace"), current.decode(errors="replace"))
        return f"{path}: {d['lines']} lines differ, numbers by up to {d['largest']:.3g}"
    return f"{path}: bytes differ ({len(committed)} -> {len(current)} bytes)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m numerics.compare", description=__doc__)
    parser.add_argument("paths", nargs="*", default=["figures"], help="default: figures")
    args = parser.parse_args(argv)
    try:
        files = changed_files(args.paths)
    except (OSError, subprocess.CalledProcessError):
        print("not a git checkout: nothing to compare the outputs with")
        return 0
    if not files:
        print(f"{', '.join(args.paths)}: identical to the committed results")
        return 0
    print(f"{len(files)} output file(s) differ from the committed results:")
    for f in files:
        print(f"  {describe(f)}")
    print(
        "(expected after a change of code or config: commit the new outputs; otherwise a result "
        "depends on the machine, see docs/numerics.md)"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
