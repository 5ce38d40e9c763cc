"""Every relative link and ``path:line`` reference of the README and docs/*.md resolves.

A link ``[text](target)`` (or an image, or a reference definition ``[id]: target``) resolves when
its file or folder exists, relative to the page (``/target``: to the repository root), and, for
``target#anchor`` into a Markdown page, when that page has a heading with GitHub's slug
``anchor``. A reference ``path.ext:LINE`` or ``path.ext:FIRST-LAST`` in the text resolves when
the file exists (relative to the repository root or the page) and has at least ``LAST`` lines.
External links (``http(s):``, ``mailto:``) are skipped; fenced code blocks are not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...
_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.I)
_EXTENSIONS = (
    "py|md|toml|json|jsonl|sh|txt|yaml|yml|cfg|ini|csv|npz|c|h|cpp|cu|rst|ipynb|lock|mk|Makefile"
)
_PATH_LINE = re.compile(
    rf"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.(?:{_EXTENSIONS})):(\d+)(?:-(\d+))?(?![\w.:])"
)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


@dataclass(frozen=True)
class Broken:
    page: str
    line: int
    reference: str
    why: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.reference}: {self.why}"


def _prose(text: str) -> str:
    """`text` with every fenced code block blanked, line numbers kept."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: Markdown marks and punctuation dropped (letters, digits,
    ``-`` and ``_`` kept), lower case, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[`*~]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a Markdown page, duplicates numbered ``-1``, ``-2`` as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_prose(path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


@cache
def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8", errors="replace").splitlines())


def _resolve(target: str, page: Path, root: Path) -> Path:
    return root / target.lstrip("/") if target.startswith("/") else page.parent / target


def broken_references(page: Path, root: Path = ROOT) -> list[Broken]:
    """The links and ``path:line`` references of `page` that do not resolve, in page order."""
    text = _prose(page.read_text(encoding="utf-8"))
    name = str(page.relative_to(root))
    out: list[Broken] = []

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    links = [(m.start(), m.group(1)) for m in _LINK.finditer(text)]
    links += [(m.start(), m.group(1)) for m in _DEFINITION.finditer(text)]
    for pos, target in sorted(links):
        if _EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        path = _resolve(file_part, page, root) if file_part else page
        if not path.exists():
            out.append(Broken(name, line_of(pos), target, "no such file or folder"))
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.resolve()):
            out.append(Broken(name, line_of(pos), target, f"no heading with anchor #{anchor}"))
    bare = _URL.sub(lambda m: " " * len(m.group(0)), text)
    for m in _PATH_LINE.finditer(bare):
        ref, first, last = m.group(1), int(m.group(2)), int(m.group(3) or m.group(2))
        candidates = [root / ref, page.parent / ref]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            out.append(Broken(name, line_of(m.start()), m.group(0), "no such file"))
        elif max(first, last) > line_count(path.resolve()):
            why = f"{ref} has {line_count(path.resolve())} lines"
            out.append(Broken(name, line_of(m.start()), m.group(0), why))
    return sorted(out, key=lambda b: b.line)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_path_line_reference_resolves(page):
    bad = broken_references(page)
    assert not bad, "broken references:\n" + "\n".join(map(str, bad))


def test_planted_broken_references_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("a = 1\nb = 2\nc = 3\n")
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A `code` heading, 2\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n"
        "[ok](other.md) [ok](other.md#other-page) [ok](other.md#a-code-heading-2) [ok](#page)\n"
        "[ok](../pkg/mod.py) [ok](/pkg) ![ok](../pkg/mod.py) [ext](https://example.com/x.md)\n"
        "pkg/mod.py:3 and pkg/mod.py:2-3 and other.md:3 at https://host.org/a.py:99 resolve.\n"
        "[gone](missing.md) [anchor](other.md#nope) [up](../nowhere/)\n"
        "pkg/mod.py:4 and pkg/mod.py:1-9 and pkg/absent.py:1\n"
        "[def]: ../missing.txt\n"
        "```\n[in code](missing.md) pkg/mod.py:99\n```\n"
    )
    bad = [f"{b.line} {b.reference} {b.why}" for b in broken_references(page, tmp_path)]
    assert bad == [
        "5 missing.md no such file or folder",
        "5 other.md#nope no heading with anchor #nope",
        "5 ../nowhere/ no such file or folder",
        "6 pkg/mod.py:4 pkg/mod.py has 3 lines",
        "6 pkg/mod.py:1-9 pkg/mod.py has 3 lines",
        "6 pkg/absent.py:1 no such file",
        "7 ../missing.txt no such file or folder",
    ]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The fourth lease (2026-11-27): the first finished study", "the-fourth-lease-2026-11-27-the-first-finished-study"),
        ("Time to a verdict (`extend`)", "time-to-a-verdict-extend"),
        ("GRPO's reference curve, and what bounds it", "grpos-reference-curve-and-what-bounds-it"),
        ("SmolLM2-135M-Instruct on a GPU", "smollm2-135m-instruct-on-a-gpu"),
    ],
)  # fmt: skip
def test_slugs_are_githubs(heading, anchor):
    assert slug(heading) == anchor
