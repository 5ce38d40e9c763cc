"""Pinned numeric code paths: the same inputs give the same bytes on any x86-64 CPU with AVX2.

numpy, scipy's and numpy's OpenBLAS, torch (ATen kernels, MKL, oneDNN) and XLA each pick their
kernels from the CPU they run on: AVX-512 loops, native-bf16 matmuls, another BLAS blocking, another
thread split. Each choice is legal and changes the last bits of a sum, and a training run amplifies
last bits into different samples, so an unpinned result is a function of the CPU as well as of its
inputs. Importing this module (every package of the project imports it first, before numpy, torch
or JAX load) fixes, through the libraries' own environment variables, every choice that was
measured to change a result (`docs/numerics.md` gives the measurements):

=============================  ======================================  ============================
variable                        value                                   what it pins
=============================  ======================================  ============================
``ATEN_CPU_CAPABILITY``         ``avx2``                                torch's vectorized kernels
``MKL_CBWR``                    ``COMPATIBLE``                          torch's MKL (GEMM, exp) code path
``ONEDNN_MAX_CPU_ISA``          ``AVX2``                                torch's oneDNN (bf16 matmuls)
``NPY_DISABLE_CPU_FEATURES``    ``X86_V4 AVX512_ICL AVX512_SPR``        numpy's AVX-512 loops
``OPENBLAS_CORETYPE``           ``Haswell``                             OpenBLAS kernels (numpy/scipy)
``OPENBLAS_NUM_THREADS``        ``1``                                   OpenBLAS thread split
``XLA_FLAGS``                   ``--xla_cpu_max_isa=AVX2`` (appended)   XLA's CPU code generation
=============================  ======================================  ============================

torch's own thread count is a run's config input (``num_threads``), not pinned here.

How threads wait (`choose_wait_policy`, not a pin: it changes speed, never bytes). libgomp, which
runs torch's and MKL's threads here, spins ~300,000 times at every barrier before it sleeps: right
on cores of its own, a collapse where another process keeps a core busy (a thread spins while the
one it waits for is descheduled). On import, unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is
set, this module samples ``/proc/stat`` for `WAIT_SAMPLE_S` and, when other processes keep at least
`BUSY_CORES` cores busy, sets ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep at once; children inherit
it). ``SHARPENING_WAIT=active|passive|auto`` overrides the choice. Measured on the tiny model's warm
start with 2 threads on 2 cores (docs/numerics.md, ``bench/bench_load.py``): idle 126 ms per step
spinning, 163 passive; beside one busy core 352-388 spinning, 223-231 passive; the same bytes.

The pin applies only on an x86-64 CPU with AVX2 and FMA (every x86-64 server CPU since 2013);
elsewhere the libraries choose freely and `state()` says so. Opting out for speed: set
``SHARPENING_NUMERICS=native`` before Python starts; nothing is pinned, and every output that
records `tag()` (theory check, toy summaries, LLM results and sweeps) says ``native`` (not
byte-comparable across machines). Importing this module after numpy, torch or JAX have loaded
cannot pin them any more: it warns, and `tag()` says ``late``. Caches key their entries on `tag()`.

Versions (`PINS`). Version 1 held MKL to ``MKL_CBWR=AVX2``: MKL's AVX2 branch is the same on every
CPU of one vendor but not across vendors (an Intel CPU takes other small-GEMM, batched-GEMM and
``exp`` kernels than an AMD one: measured under QEMU's Intel and AMD models, docs/numerics.md).
Version 2 holds it to ``COMPATIBLE``, MKL's one branch for every x86-64 CPU. Version 3 pins the
same variables as version 2 and changes the package's own arithmetic: a group whose rewards are all
equal has centred rewards exactly 0 (`shaping.core.dr_grpo_advantages`; under versions 1-2 float32
rounding of the group mean left a residual that GRPO's ``std + eps`` turned into advantages up to
0.06, docs/numerics.md). `version()` is the version this process computes under (`VERSION` when
not pinned), so the package's arithmetic follows the pin a process asks for. Outputs recorded under
version N are reproduced with ``SHARPENING_NUMERICS=pinned-vN`` (version 1 on an AMD CPU).

Imports nothing outside the standard library (it must run before numpy does).
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager

OPT_OUT_ENV = "SHARPENING_NUMERICS"
"""``pinned`` (default: `VERSION`'s pins), ``pinned-vN`` (version N's pins, `PINS`) or ``native``:
whether and how this module pins the libraries' code paths."""

VERSION = 3
"""Bumped whenever `PINNED_ENV` or the package's own arithmetic changes a result's bytes, so caches
and committed outputs know the settings."""

EXACT_CENTRING = 3
"""The first version whose group-centred rewards are exactly 0 on a constant group."""

LEVEL = "avx2"
"""The instruction-set level every pinned library is held to (x86-64-v3: AVX2, FMA)."""

XLA_FLAG = "--xla_cpu_max_isa=AVX2"
"""The XLA flag appended to ``XLA_FLAGS`` (an unknown flag aborts XLA, so only this one)."""

_V1: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Haswell",
    "OPENBLAS_NUM_THREADS": "1",
}

_V2: dict[str, str] = {**_V1, "MKL_CBWR": "COMPATIBLE"}

PINS: dict[int, dict[str, str]] = {1: _V1, 2: _V2, 3: _V2}
"""Every version's pins, by version (version 1 is the same bytes only among CPUs of one vendor;
version 3 differs from 2 in the package's arithmetic, `EXACT_CENTRING`, not in its pins)."""

PINNED_ENV: dict[str, str] = PINS[VERSION]
"""Each library's own variable and the value that pins it (``XLA_FLAGS`` is merged separately)."""

BASELINE_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Nehalem",
    "OPENBLAS_NUM_THREADS": "2",
    "XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2",
}
"""The same variables forcing every library down to the x86-64 baseline (SSE4.2, no AVX): the
environment of a different CPU, which the two-level check (`tests/test_numerics.py`) runs the
package under next to the machine's own. With the pin on, the package's results must not change."""

_HEAVY = ("numpy", "scipy", "torch", "jax", "jaxlib")

WAIT_ENV = "SHARPENING_WAIT"
"""``auto`` (default: `choose_wait_policy` measures), ``passive`` or ``active`` (libgomp's spin)."""

WAIT_SAMPLE_S = 0.1
"""Seconds of ``/proc/stat`` that `choose_wait_policy` reads (10 scheduler ticks per core)."""

BUSY_CORES = 0.5
"""Cores kept busy by other processes from which threads wait passively: one CPU-bound process
reads ~1.0, an idle machine ~0.0-0.1."""

_state: dict[str, object] = {}


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _pinnable() -> str | None:
    """None when this machine can be pinned, else the reason it cannot."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not x86-64 ({platform.machine()})"
    flags = cpu_flags()
    if flags and not {"avx2", "fma"} <= flags:
        return "the CPU lacks AVX2 or FMA"
    return None


def merge_xla_flags(current: str | None, flag: str = XLA_FLAG) -> str:
    """``XLA_FLAGS`` with any ``--xla_cpu_max_isa=...`` replaced by `flag` (others kept)."""
    kept = [f for f in (current or "").split() if not f.startswith("--xla_cpu_max_isa")]
    return " ".join([*kept, flag])


def pin(environ: dict[str, str] | None = None) -> dict[str, object]:
    """Set the pinned variables in `environ` (default `os.environ`) and return `state()`.

    Idempotent; called on import. Does nothing with ``SHARPENING_NUMERICS=native`` or on a CPU that
    cannot be pinned; warns (`RuntimeWarning`) when a library of `_HEAVY` has already been imported.

    Raises:
        ValueError: ``SHARPENING_NUMERICS`` is none of ``pinned``, ``pinned-vN`` (N a version of
            `PINS`) and ``native``.
    """
    env = os.environ if environ is None else environ
    mode = env.get(OPT_OUT_ENV, "pinned").strip().lower() or "pinned"
    version = pinned_version(mode)
    _state["version"] = VERSION if version is None else version
    reason = "opted out" if mode == "native" else _pinnable()
    if reason is not None:
        _state.update(pinned=False, reason=reason, tag=f"native ({reason}): not byte-comparable")
        return state()
    if environ is None and "before" not in _state:
        _state["before"] = {k: env.get(k) for k in [*PINNED_ENV, "XLA_FLAGS"]}
    for key, value in PINS[version].items():
        env[key] = value
    env["XLA_FLAGS"] = merge_xla_flags(env.get("XLA_FLAGS"))
    late = sorted(m for m in _HEAVY if m in sys.modules) if environ is None else []
    if late:
        warnings.warn(
            f"numerics: {', '.join(late)} loaded before the numeric paths were pinned; import a "
            "project package (theory, shaping, toymdp, llm) first, or results may differ by CPU",
            RuntimeWarning,
            stacklevel=2,
        )
        _state.update(pinned=False, reason="late", tag=f"late ({', '.join(late)} loaded first)")
    else:
        _state.update(pinned=True, reason=None, tag=_pinned_tag(version))
    return state()


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores from ``/proc/stat`` (None where it cannot be read)."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def busy_cores(
    seconds: float = WAIT_SAMPLE_S, sample: Callable = _cpu_times, sleep: Callable = time.sleep
) -> float | None:
    """How many cores were busy over the next `seconds` (``/proc/stat``; this process sleeps
    meanwhile, so the busy ones are other processes'); None where it cannot be read."""
    a = sample()
    sleep(seconds)
    b = sample()
    if a is None or b is None or b[1] <= a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or 1)


def choose_wait_policy(
    environ: MutableMapping[str, str] | None = None, busy: Callable = busy_cores
) -> str:
    """Choose how libgomp's threads wait, before torch loads it (module docstring): sets
    ``OMP_WAIT_POLICY=PASSIVE`` in `environ` (default `os.environ`) when ``SHARPENING_WAIT`` is
    ``passive``, or ``auto`` (its default) and `busy` (`busy_cores`) reads at least `BUSY_CORES`.
    A policy already set (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) is kept. Returns what holds:
    ``"set by the environment"``, ``"passive (N busy cores)"``, ``"active (...)"``.

    Raises:
        ValueError: ``SHARPENING_WAIT`` is none of ``auto``, ``passive``, ``active``.
    """
    env = os.environ if environ is None else environ
    mode = env.get(WAIT_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "passive", "active"):
        raise ValueError(f"{WAIT_ENV}={mode!r}: expected 'auto', 'passive' or 'active'")
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return "set by the environment"
    if mode == "active":
        return f"active ({WAIT_ENV}=active)"
    if mode == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        return "passive"
    n = busy()
    if n is None:
        return "active"
    if n >= BUSY_CORES:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        return f"passive ({n:.1f} busy cores)"
    return f"active ({n:.1f} busy cores)"


def _pinned_tag(version: int) -> str:
    return f"pinned {LEVEL} v{version}"


def version_of(recorded: str) -> int | None:
    """The version an output's recorded `tag()` names (1 for ``"pinned avx2 v1"``), or None for a
    tag of no version of `PINS` (``native``, ``late``)."""
    return {_pinned_tag(v): v for v in PINS}.get(recorded)


def same_arithmetic(recorded: str) -> bool | None:
    """Whether the package's own arithmetic under the recorded `tag()` is this process's (both
    before or both from `EXACT_CENTRING`); None when the tag names no version."""
    v = version_of(recorded)
    return None if v is None else (v >= EXACT_CENTRING) == (version() >= EXACT_CENTRING)


def same_pins(recorded: str) -> bool:
    """Whether what the libraries compute alone (no arithmetic of the package's own that
    `EXACT_CENTRING` changes: the tiny base model's warm start) gives this process's bytes under
    the recorded `tag()`: the same tag, or this process pinned and `recorded` a version with the
    same `PINS` (2 and 3). A cache of such a computation is keyed with it, so that following a
    committed study's version (`following`) does not rebuild it."""
    if recorded == tag():
        return True
    v = version_of(recorded)
    return v is not None and is_pinned() and PINS[v] == PINS[version()]


@contextmanager
def following(recorded: str | None) -> Iterator[str]:
    """Compute as an output recorded under `recorded` (its `tag()`) was computed, where that needs
    no new process; yields the `tag()` in force.

    Switches when this process is pinned, ``SHARPENING_NUMERICS`` is not set (a choice made
    there stands), and `recorded` names another version whose pins are this process's: then only
    the package's arithmetic differs (versions 2 and 3, `EXACT_CENTRING`), and `version()`,
    `tag()` and, for child processes, ``SHARPENING_NUMERICS`` follow `recorded` until the block
    ends. Otherwise nothing changes (another version's pins need a new process:
    `setting_for`). An extension of a committed study runs in it (`experiment.extend`), so new
    methods train under the arithmetic of the study's reference runs.
    """
    v = version_of(recorded) if recorded else None
    here = version()
    if v is None or v == here or not is_pinned() or OPT_OUT_ENV in os.environ:
        yield tag()
        return
    if PINS[v] != PINS[here]:
        yield tag()
        return
    saved = {k: _state[k] for k in ("version", "tag")}
    os.environ[OPT_OUT_ENV] = f"pinned-v{v}"
    _state.update(version=v, tag=_pinned_tag(v))
    try:
        yield tag()
    finally:
        _state.update(saved)
        os.environ.pop(OPT_OUT_ENV, None)


def setting_for(recorded: str) -> str | None:
    """The ``SHARPENING_NUMERICS`` value that pins a process as an output's recorded `tag()` says
    (``"pinned-v1"`` for ``"pinned avx2 v1"``), or None for a tag of no version of `PINS`."""
    v = version_of(recorded)
    return None if v is None else f"pinned-v{v}"


def pinned_version(mode: str) -> int | None:
    """The pin version a ``SHARPENING_NUMERICS`` value asks for (None for ``native``).

    Raises:
        ValueError: `mode` is none of ``pinned``, ``pinned-vN`` (N in `PINS`) and ``native``.
    """
    if mode == "native":
        return None
    if mode == "pinned":
        return VERSION
    head, _, number = mode.partition("-v")
    if head == "pinned" and number.isdigit() and int(number) in PINS:
        return int(number)
    versions = ", ".join(f"'pinned-v{v}'" for v in PINS)
    raise ValueError(f"{OPT_OUT_ENV}={mode!r}: expected 'pinned', {versions} or 'native'")


def state() -> dict[str, object]:
    """``{"pinned": bool, "reason": str | None, "tag": str}`` of this process."""
    return {k: _state[k] for k in ("pinned", "reason", "tag")}


def wait_policy() -> str:
    """How this process's OpenMP threads wait (`choose_wait_policy`'s answer at import)."""
    return str(_state.get("wait", "not chosen"))


def original_environ() -> dict[str, str]:
    """A copy of `os.environ` with the variables this process's pin set back to what they were
    before it (removed where they were unset): the machine's own environment, for a child process
    that must not inherit the pin (the two-level check runs children under forced levels)."""
    env = dict(os.environ)
    before = _state.get("before", {})
    assert isinstance(before, dict)
    for key, value in before.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def version() -> int:
    """The numerics version this process computes under: the pinned one (``pinned-vN``), else
    `VERSION`. The package's own arithmetic branches on it (`EXACT_CENTRING`)."""
    return int(_state.get("version", VERSION))  # type: ignore[call-overload]


def tag() -> str:
    """One string naming the numeric settings: ``"pinned avx2 v1"``, or ``"native (...)"`` /
    ``"late (...)"`` for results that are not byte-comparable across machines. Outputs record it
    and cache keys include it."""
    return str(_state["tag"])


def is_pinned() -> bool:
    """True when this process runs on the pinned code paths."""
    return bool(_state["pinned"])


pin()
if not any(m in sys.modules for m in _HEAVY):  # libgomp reads it once, when torch loads it
    _state["wait"] = choose_wait_policy()
