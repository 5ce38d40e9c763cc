"""Write the registry's methods table into docs/shaping.md: ``python -m shaping.readme [PAGE]``.

The table is `shaping.methods_table()` between two HTML comment markers, so the docs never
restate the registry by hand (a test compares them).
"""

from __future__ import annotations

import sys
from pathlib import Path

from shaping.methods import methods_table

BEGIN = "<!-- methods-table:begin -->"
END = "<!-- methods-table:end -->"


def table_block() -> str:
    """The markers with the current registry table between them."""
    return f"{BEGIN}\n{methods_table()}\n{END}"


def update(path: str | Path) -> bool:
    """Replace the block between the markers in `path`; returns whether the file changed.

    Raises:
        ValueError: `path` lacks one of the markers.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path}: needs the markers {BEGIN} and {END}")
    new = text[: text.index(BEGIN)] + table_block() + text[text.index(END) + len(END) :]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "docs/shaping.md"
    print(f"{target}: {'updated' if update(target) else 'already current'}")
