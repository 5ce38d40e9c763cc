"""The README is a landing page and docs/ a reference (issue 57), and the methods table in
docs/shaping.md is generated from the registry and must match it.

Regenerate the table with ``python -m shaping.readme`` after adding or changing a method, and the
README's claims with ``python -m experiment claims`` (tests/experiment/test_claims_layout.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import shaping
from experiment.__main__ import BEGIN as CLAIMS_BEGIN
from experiment.__main__ import END as CLAIMS_END
from shaping.readme import BEGIN, END, table_block

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
METHODS_PAGE = ROOT / "docs" / "shaping.md"
DATED: set[str] = set()
"""Reference pages allowed to carry dates (none: history lives in CHANGELOG.md)."""


def test_methods_table_matches_registry() -> None:
    text = METHODS_PAGE.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "docs/shaping.md lost its methods-table markers"
    block = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert block == table_block(), "the methods table is stale: run `python -m shaping.readme`"
    for name in shaping.METHODS:
        assert f"| `{name}` |" in block


def _prose(text: str) -> str:
    """The README without its generated claims block."""
    assert CLAIMS_BEGIN in text and CLAIMS_END in text, "README lost its claims markers"
    return text[: text.index(CLAIMS_BEGIN)] + text[text.index(CLAIMS_END) + len(CLAIMS_END) :]


def test_readme_is_a_landing_page() -> None:
    """Issue 57's targets: at most 1,000 words and 10 kB outside the generated claims, no dates,
    no line over 200 characters, the headline result in the first 20 lines, the two commands and
    the two ways in for a user (a method, a theorem)."""
    text = README.read_text(encoding="utf-8")
    prose = _prose(text)
    assert len(prose.split()) <= 1000, f"README: {len(prose.split())} words outside the claims"
    assert len(prose.encode()) <= 10_000, f"README: {len(prose.encode())} bytes outside the claims"
    assert "2026-" not in prose, "README carries a date: history belongs in CHANGELOG.md"
    long = [i + 1 for i, line in enumerate(prose.splitlines()) if len(line) > 200]
    assert not long, f"README lines over 200 characters: {long}"
    head = "\n".join(text.splitlines()[:20])
    assert "**What the studies find.**" in head and "beats tuned GRPO" in head, (
        "README: the headline left the first 20 lines"
    )
    for must in ("make reproduce", "make test", "identical to the committed results", "--extend",
                 "docs/adding_a_method.md", "theory.strategies", "shaping.strategies",
                 "docs/property_testing.md", "docs/results.md"):  # fmt: skip
        assert must in prose, f"README lost {must!r}"


def test_docs_are_reference_pages() -> None:
    """docs/*.md describe the package as it is: no dates (history goes to CHANGELOG.md), and the
    archive docs/superseded/ is linked from CHANGELOG.md only."""
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) > 10
    for page in [README, *pages]:
        text = page.read_text(encoding="utf-8")
        if page.name not in DATED:
            assert "2026-" not in text, f"{page.name} carries a date: history goes to CHANGELOG.md"
        assert not re.search(r"\]\((?:\.\./)?(?:docs/)?superseded/", text), (
            f"{page.name} links into docs/superseded/ (the archive is linked from CHANGELOG.md)"
        )
    assert "docs/superseded/" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_ci_runs_both_tiers_of_the_readmes_test_commands() -> None:
    """`make test` deselects the tests marked slow, `make test-slow` runs only them, and `.ci/run`
    calls both, so CI runs every test."""
    prose = _prose(README.read_text(encoding="utf-8"))
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for command in ("make test", "make test-slow"):
        assert f"\n{command} " in prose, f"README lost {command!r}"
        assert command in ci, f".ci/run does not call {command!r}"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipes = makefile.split("\n\n")
    test = next(r for r in recipes if "\ntest: " in f"\n{r}")
    slow = next(r for r in recipes if "\ntest-slow: " in f"\n{r}")
    assert '$(PYTEST) -m "not slow"' in test and "$(PYTEST) -m slow" in slow
    assert re.search(r"^PYTEST := \$\(PY\) -m pytest ", makefile, re.M)


def test_install_lines_name_what_an_index_has():
    """The package is installed from its checkout (no package index carries it), so no page or
    error message tells a user to ``pip install 'sharpening[...]'``."""
    files = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for package in ("numerics", "theory", "shaping", "experiment", "toymdp", "llm"):
        files += sorted((ROOT / package).rglob("*.py"))
    wrong = [str(f.relative_to(ROOT)) for f in files
             if re.search(r"pip\s+install\s+[\"']?sharpening\[", f.read_text(encoding="utf-8"))]  # fmt: skip
    assert not wrong, f"pip install of an unpublished name in {wrong}"


def test_pages_and_modules_cite_no_tracker_issue():
    """Users read the README, docs/ and the docstrings without the project's issue tracker, so
    they cite files, papers and code, never ``issue N`` (CHANGELOG.md may: it is history)."""
    files = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for package in ("numerics", "theory", "shaping", "experiment", "toymdp", "llm"):
        files += sorted((ROOT / package).rglob("*.py"))
    cited = [f"{f.relative_to(ROOT)}:{i}" for f in files
             for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\b[Ii]ssues? \d+", line)]  # fmt: skip
    assert not cited, f"issue numbers cited in {cited}"
