"""The README's methods table is generated from the registry and must match it.

Regenerate with ``python -m shaping.readme`` after adding or changing a method.
"""

from __future__ import annotations

from pathlib import Path

import shaping
from shaping.readme import BEGIN, END, table_block

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_methods_table_matches_registry() -> None:
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "README lost its methods-table markers"
    block = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert block == table_block(), "README methods table is stale: run `python -m shaping.readme`"
    for name in shaping.METHODS:
        assert f"| `{name}` |" in block


def test_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 150
