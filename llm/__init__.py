"""GRPO-family trainer for language models on torch + transformers (`python -m llm ...`).

Needs the package's ``llm`` extra (torch, transformers, tokenizers, ...): ``make install`` in the
checkout, or ``pip install -e '.[llm]'`` there. Importing `llm` without it raises an `ImportError`
that names the missing modules and the extra.
"""

import numerics  # noqa: F401  (pins torch's, numpy's and XLA's code paths before they load)

# isort: split
import importlib.util

REQUIRES = ("torch", "transformers", "tokenizers")
"""The ``llm`` extra's modules every `llm` command imports."""


def _missing(names: tuple[str, ...]) -> list[str]:
    """The modules of `names` that cannot be imported here (found by name, none imported)."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ValueError:  # in sys.modules as None: its import fails
            found = False
        if not found:
            out.append(name)
    return out


_MISSING = _missing(REQUIRES)
if _MISSING:
    raise ImportError(
        f"the llm package needs {', '.join(_MISSING)}, not installed: install the "
        "package's llm extra (make install in the checkout, or pip install -e '.[llm]' there)"
    )
