"""The command lines' one error convention (``python -m toymdp|llm|experiment``): an error prints one
line, ``error: <message> (--debug shows the traceback)``, to stderr and exits 2; ``--debug``
anywhere on the line lets it propagate with its traceback. (`theory`, a floor below, keeps its own
copy of these lines: it may not import this layer; docs/architecture.md.)

Long work reports its progress one way (`progress_bar`): tqdm's bar on a terminal, one line per
finished item where stderr is a file (a run in the background, its log), and nothing when asked.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shaping import import_methods


def progress_bar(
    total: int, desc: str, unit: str, *, progress: bool, log: bool | None = None
) -> Any:
    """What reports a loop over `total` items (`update` per finished item, `set_postfix_str`,
    `close`): tqdm's bar on stderr, or one `LineProgress` line per item, or nothing.

    Args:
        total, desc, unit: the bar's length, label and item name (``run``, ``program``, ...).
        progress: report at all.
        log: lines rather than a bar; None: lines where stderr is not a terminal (a log file).
    """
    lines = not sys.stderr.isatty() if log is None else log
    if progress and lines:
        return LineProgress(total, desc)
    return tqdm(total=total, desc=desc, disable=not progress, unit=unit)


class LineProgress:
    """Progress for a log file: one line on stderr per finished item,
    ``DESC: 12/51 (NAME), 5:31 elapsed, ~18:02 left`` (NAME: the last `set_postfix_str`; time left:
    the mean time per finished item so far), where a tqdm bar would write carriage returns. Has the
    methods of tqdm's bar that `progress_bar`'s callers use."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done, self.name = total, desc, 0, ""
        self.start = time.monotonic()

    def set_postfix_str(self, name: str) -> None:
        self.name = name

    def update(self, n: int = 1) -> None:
        self.done += n
        spent = time.monotonic() - self.start
        left = spent / self.done * (self.total - self.done)
        print(f"{self.desc}: {self.done}/{self.total} ({self.name}), "
              f"{tqdm.format_interval(spent)} elapsed, ~{tqdm.format_interval(left)} left",
              file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        pass


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


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= `low` (``--workers``, ``--steps``: 1; ``--seed``: 0);
    anything else is refused by argparse, naming the flag and the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {low}, got {text!r}"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


at_least_one = int_at_least(1)
"""`int_at_least` (1): counts (``--workers``, ``--steps``, ``--jobs``)."""
seed_value = int_at_least(0)
"""`int_at_least` (0): seeds (``--seed``; NumPy's generators take no negative seed)."""


def add_set_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """The ``--set KEY=VALUE ...`` option of every command that takes config overrides (into
    ``args.sets``, in order; parsed by `llm.config.apply_overrides` or a sweep loader's
    `experiment.spec.apply_sets`)."""
    parser.add_argument(
        "--set", dest="sets", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
        help=help,
    )  # fmt: skip


OWN_METHOD = "a method of one's own (--import the module that registers it)"
"""What an unknown method's error adds after the registry's names (the config and sweep files)."""
OWN_TASK = "a task of one's own (--import the module that registers it)"
"""The same for an unknown LLM task."""


def add_import_argument(parser: argparse.ArgumentParser) -> None:
    """``--import MODULE`` (repeatable): a module of the user's own (a name importable from the
    current folder, or a ``.py`` path) that registers methods (`shaping.register`) or LLM tasks
    (`llm.tasks.register_task`), imported by `import_methods` before the command reads its
    config; worker processes import it too."""
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import a module (name or .py path) that registers methods or "
                             "tasks; repeatable")  # fmt: skip


def extend_arguments(parser: argparse.ArgumentParser, example: str, default_out: str) -> None:
    """A study command's extension flags (`experiment.extend`): ``--extend DIR``, ``--methods
    FILE``, ``--import MODULE`` (repeatable), ``--retrain-reference`` and ``--complete DIR``."""
    parser.add_argument("--extend", type=Path, metavar="STUDY_DIR",
                        help=f"extend a committed study (e.g. {example}) by --methods, GRPO's "
                             f"reference not re-trained; output in --out (default {default_out})")  # fmt: skip
    parser.add_argument("--methods", type=Path, metavar="FILE",
                        help="a TOML file of [[methods]] tables (with --extend)")  # fmt: skip
    add_import_argument(parser)
    parser.add_argument("--retrain-reference", action="store_true",
                        help="with --extend: re-train GRPO's reference in full instead of "
                             "reusing the committed one")  # fmt: skip
    parser.add_argument("--complete", type=Path, metavar="STUDY_DIR",
                        help="train the confirmation of a committed study's pending picks (a "
                             "re-read by a later procedure picked settings its confirmation did "
                             "not train) and read the whole study again; output in --out "
                             "(default runs/<toy|llm>_complete/<study folder>)")  # fmt: skip


def completing(args: argparse.Namespace) -> bool:
    """Whether a study command completes a committed study's pending confirmations
    (``--complete DIR``, `experiment.extend.complete`), after importing ``--import``'s modules.

    Raises:
        ValueError: ``--complete`` with ``--config``, ``--extend``, ``--methods`` or
            ``--retrain-reference``.
        FileNotFoundError: no such folder (named).
    """
    if args.complete is None:
        return False
    given = [flag for flag, on in (("--config", args.config is not None),
                                   ("--extend", args.extend is not None),
                                   ("--methods", args.methods is not None),
                                   ("--retrain-reference", args.retrain_reference)) if on]  # fmt: skip
    if given:
        raise ValueError(f"--complete: the committed study names its config and methods; drop "
                         f"{', '.join(given)}")  # fmt: skip
    import_methods(args.imports)
    if not args.complete.is_dir():
        raise FileNotFoundError(f"--complete: no such folder {str(args.complete)!r}")
    return True


def extending(args: argparse.Namespace) -> bool:
    """Whether a study command extends a committed study (`extend_arguments`), after importing
    ``--import``'s modules; checks the flags go together.

    Raises:
        ValueError: ``--extend`` without ``--methods`` or with ``--config``, ``--methods`` without
            ``--extend``, neither ``--extend`` nor ``--config``, or a missing file (named).
    """
    import_methods(args.imports)
    if args.extend is None:
        if args.methods is not None or args.retrain_reference:
            raise ValueError("--methods, --retrain-reference: only with --extend STUDY_DIR")
        if args.config is None:
            raise ValueError("study: --config FILE, --extend STUDY_DIR --methods FILE or "
                             "--complete STUDY_DIR is required")  # fmt: skip
        require_file(args.config, "--config")
        return False
    if args.config is not None:
        raise ValueError("--extend: the committed study names its own config; drop --config")
    if args.methods is None:
        raise ValueError("--extend: --methods FILE is required (a TOML file of [[methods]] tables)")
    if not args.extend.is_dir():
        raise FileNotFoundError(f"--extend: no such folder {str(args.extend)!r}")
    require_file(args.methods, "--methods")
    return True


def require_file(path: str | Path, flag: str) -> Path:
    """`path`, the file a command line gave as `flag`, as a `Path`.

    Raises:
        FileNotFoundError: ``FLAG: no such file 'PATH'`` (a folder is not a file).
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"{flag}: no such file {str(path)!r}")
    return Path(path)


def print_claims(result: Mapping[str, Any]) -> None:
    """A study's claims (study.json's ``claims``), one line each: its verdict word (or, for the
    spread row, which has none, its lift in points) and the claim's text."""
    for row in result["claims"]:
        head = row["verdict"] or f"{row['lift']:+.1f} points"  # the spread row: no verdict
        print(f"{head:>13}: {row['text']}")
