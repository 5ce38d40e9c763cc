"""The command lines' one error convention (``python -m toymdp|llm|experiment``): an error prints one
line, ``error: <message> (--debug shows the traceback)``, to stderr and exits 2; ``--debug``
anywhere on the line lets it propagate with its traceback. (`theory`, a floor below, keeps its own
copy of these lines: it may not import this layer; docs/architecture.md.)
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def run(main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """``main(argv without --debug)``, its errors turned into one line on stderr and status 2.

    Args:
        main: the command's body; returns the exit status.
        argv: the arguments (default ``sys.argv[1:]``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        return main([a for a in argv if a != "--debug"])
    except Exception as e:
        if debug:
            raise
        print(f"error: {one_line(e)} (--debug shows the traceback)", file=sys.stderr)
        return 2


def one_line(e: BaseException) -> str:
    """An exception as one line: the message of a ValueError or OSError (written for users),
    else prefixed with the exception's type."""
    text = " ".join(str(e).split())
    if isinstance(e, ValueError | OSError) and text:
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
