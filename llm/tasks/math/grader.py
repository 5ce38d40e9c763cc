"""The subprocess grader pool: math-verify run in separate Python processes, each call under a hard
wall-clock limit (`llm.tasks.math.grading.answers_equivalent` says why). math-verify is imported
only here, in the child processes and in `_verify_here`."""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

_logger = logging.getLogger(__name__)

# Grader processes kept at most; one is started per concurrently grading thread, on demand.
MAX_GRADER_PROCESSES = max(1, min(4, os.cpu_count() or 1))


@lru_cache(maxsize=1)
def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as e:
        raise RuntimeError(
            "grading math answers needs math-verify: pip install 'math-verify[antlr4_13_2]'"
        ) from e
    # We run math-verify with its timeouts off and bound time ourselves (see
    # `answers_equivalent`); its one-time warning that timeouts are off is therefore noise.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return math_verify


@lru_cache(maxsize=1)
def _extraction_config() -> tuple[Any, ...]:
    # Only LaTeX extraction, boxed first: the input is always `\boxed{answer}`. The plain
    # expression extractor (ExprExtractionConfig) is left out because, when the LaTeX parse of a
    # garbled answer fails, it falls back to any number in the text, which could match by chance.
    mv = _math_verify()
    return (mv.LatexExtractionConfig(boxed_match_priority=0),)


@lru_cache(maxsize=1024)
def _parse_boxed(answer: str) -> tuple[Any, ...]:
    # Cached because a group of G responses shares one gold answer.
    mv = _math_verify()
    parsed = mv.parse(
        "\\boxed{" + answer + "}", extraction_config=_extraction_config(), parsing_timeout=None
    )
    return tuple(parsed)


def _verify_here(gold: str, pred: str) -> bool:
    """math-verify in this process with its timeouts off (thread-safe, unbounded)."""
    mv = _math_verify()
    try:
        return bool(
            mv.verify(list(_parse_boxed(gold)), list(_parse_boxed(pred)), timeout_seconds=None)
        )
    except Exception:
        # math-verify already maps its own errors to False (raise_on_error=False); this only
        # catches what escapes it, e.g. RecursionError on deeply nested input.
        return False


# The child's program: import this module from the package and serve requests on stdin/stdout.
_GRADER_BOOT = "from llm.tasks.math.grader import _serve_grader; _serve_grader()"
# The directory holding the `llm` package, put on the child's PYTHONPATH.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
_START_TIMEOUT_S = 120.0


class _GraderProcess:
    """One child Python process that answers `{"gold", "pred"}` lines with `{"correct"}` lines."""

    # Set once any grader of this process has started: from then on a failed restart is a
    # transient fault (counted as a timed-out answer), not a broken installation (raised).
    started_once = False

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def judge(self, gold: str, pred: str, timeout_s: float) -> tuple[bool, bool]:
        if self._proc is None or self._proc.poll() is not None:
            try:
                self._start()
            except RuntimeError:
                if not _GraderProcess.started_once:
                    raise
                _logger.warning("math grader process failed to restart", exc_info=True)
                return False, True
        assert self._proc is not None
        request = json.dumps({"gold": gold, "pred": pred}).encode() + b"\n"
        deadline = time.monotonic() + timeout_s
        try:
            # The child has read every earlier request, so this short line fits in the empty
            # pipe buffer and the write does not block.
            _write_all(self._proc, request)
            line = self._read_line(deadline)
        except (OSError, EOFError):
            self.kill()
            return False, True
        if line is None:
            self.kill()
            return False, True
        try:
            return bool(json.loads(line)["correct"]), False
        except (ValueError, KeyError, TypeError):
            self.kill()
            return False, True

    def _start(self) -> None:
        self.kill()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _GRADER_BOOT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                bufsize=0,
            )
        except OSError as e:
            raise RuntimeError(f"math grader process failed to start: {e}") from e
        try:
            line = self._read_line(time.monotonic() + _START_TIMEOUT_S)
        except (OSError, EOFError):
            line = None
        ready = None
        if line is not None:
            try:
                ready = json.loads(line)
            except ValueError:
                ready = None
        if not isinstance(ready, dict) or ready.get("ready") is not True:
            self.kill()
            reason = (
                ready.get("error")
                if isinstance(ready, dict)
                else "no answer from it (see its stderr)"
            )
            raise RuntimeError(f"math grader process failed to start: {reason}")
        _GraderProcess.started_once = True

    def _read_line(self, deadline: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        # poll, not select: select fails on descriptors above 1023, common in a trainer process.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not poller.poll(math.ceil(remaining * 1000)):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("grader process closed its output")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        proc, self._proc = self._proc, None
        self._buffer = b""
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def abandon(self) -> None:
        """Forget a process inherited through `fork`: close our copies of its pipes, never kill."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
            proc.returncode = 0  # so that Popen.__del__ does not track a process we do not own


def _write_all(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    view = memoryview(data)
    while view:
        written = proc.stdin.write(view)
        view = view[written or 0 :]


class _GraderPool:
    """Up to `MAX_GRADER_PROCESSES` grader processes, each serving one calling thread at a time."""

    def __init__(self) -> None:
        self._reset()
        atexit.register(self.close)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[_GraderProcess] = []
        self._all: list[_GraderProcess] = []

    def judge(self, gold: str, pred: str, timeout_s: float) -> tuple[bool, bool]:
        with self._cond:
            while not self._idle and len(self._all) >= MAX_GRADER_PROCESSES:
                self._cond.wait()
            if self._idle:
                grader = self._idle.pop()
            else:
                grader = _GraderProcess()
                self._all.append(grader)
        try:
            return grader.judge(gold, pred, timeout_s)
        finally:
            with self._cond:
                self._idle.append(grader)
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            graders = list(self._all)
        for grader in graders:
            grader.kill()

    def after_fork_in_child(self) -> None:
        # A forked child shares the parent's pipes (and maybe a held lock): start afresh.
        for grader in self._all:
            grader.abandon()
        self._reset()


_GRADERS = _GraderPool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_GRADERS.after_fork_in_child)


def _serve_grader() -> None:
    """Main loop of a grader process: one JSON request per stdin line, one reply per line."""
    # Ctrl-C in a terminal reaches the whole process group; the parent decides when we stop (it
    # closes our stdin or kills us), so a KeyboardInterrupt here would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Replies go to a private copy of stdout; anything else printed lands on stderr, so that no
    # stray output can corrupt the protocol.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        _math_verify()
    except RuntimeError as e:
        replies.write(json.dumps({"ready": False, "error": str(e)}) + "\n")
        replies.flush()
        return
    # Warm up (ANTLR parser set-up, SymPy caches: about 0.4 s) before reporting ready, so that
    # the first request's time limit is spent on the request.
    _verify_here("\\frac{1}{2}", "0.5")
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            correct = _verify_here(str(request["gold"]), str(request["pred"]))
        except Exception:
            correct = False
        replies.write(json.dumps({"correct": correct}) + "\n")
        replies.flush()
