"""The numeric paths are pinned (`numerics`, issue 19): a short piece of every leg gives the same
bytes on this machine's own CPU level and on the x86-64 baseline forced through the libraries' own
variables (`numerics.BASELINE_ENV`), which stands in for "another x86-64 CPU". The same pieces run
unpinned (``SHARPENING_NUMERICS=native``) must differ between the two levels, or the check would
prove nothing.

Pieces (each a real command, run in a fresh process): ``theory check --json`` (numpy, scipy,
OpenBLAS), a toy sweep (XLA), and ``llm reproduce --quick`` with 20 training steps (torch: the base
model's warm start, GRPO and the entropy bonus, evaluation; the sweep's results.json records every
checkpoint's weight hash; its wall-clock fields are dropped).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import numerics
from numerics import emulate

ROOT = Path(__file__).resolve().parents[1]

PIECES = emulate.PIECES


def _env(level: str, mode: str) -> dict[str, str]:
    env = emulate.piece_env()
    env[numerics.OPT_OUT_ENV] = mode
    if level == "baseline":
        env.update(numerics.BASELINE_ENV)
    return env


def _two_levels(name: str, mode: str, tmp_path: Path) -> tuple[bytes, bytes]:
    """The piece's bytes at the machine's level, then at the baseline, in the same folder (outputs
    record their paths)."""
    out = []
    for level in ("machine", "baseline"):
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        out.append(emulate.piece_bytes(name, tmp_path / "out", _env(level, mode)))
    return out[0], out[1]


needs_pin = pytest.mark.skipif(
    not numerics.is_pinned(), reason=f"numeric paths not pinned here: {numerics.tag()}"
)


@needs_pin
@pytest.mark.slow
@pytest.mark.parametrize("name", PIECES)
def test_pinned_results_do_not_depend_on_the_cpu_level(name, tmp_path):
    machine, baseline = _two_levels(name, "pinned", tmp_path)
    assert b"pinned avx2" in machine
    assert machine == baseline, f"{name}: the pinned result changes with the CPU level"


@needs_pin
@pytest.mark.slow
@pytest.mark.parametrize("name", PIECES)
def test_the_check_catches_an_unpinned_run(name, tmp_path):
    """Unpinned, the forced baseline changes every piece: the check above can fail."""
    machine, baseline = _two_levels(name, "native", tmp_path)
    assert b"native (opted out)" in machine
    assert machine != baseline, f"{name}: the forced level changed nothing; the check is vacuous"


def test_pin_sets_every_variable_and_keeps_other_xla_flags(monkeypatch):
    monkeypatch.setattr(numerics, "_state", dict(numerics._state))
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_cpu_max_isa=AVX512"}
    st = numerics.pin(env)
    for key, value in numerics.PINNED_ENV.items():
        assert env[key] == value
    assert env["XLA_FLAGS"] == f"--xla_dump_to=/tmp/x {numerics.XLA_FLAG}"
    assert set(st) == {"pinned", "reason", "tag"}


def test_opt_out_pins_nothing_and_bad_values_are_named(monkeypatch):
    monkeypatch.setattr(numerics, "_state", dict(numerics._state))  # this process's state stays
    env = {numerics.OPT_OUT_ENV: "native"}
    numerics.pin(env)
    assert env == {numerics.OPT_OUT_ENV: "native"}
    assert numerics.tag().startswith("native (opted out)")
    with pytest.raises(ValueError, match="SHARPENING_NUMERICS='fast'"):
        numerics.pin({numerics.OPT_OUT_ENV: "fast"})


def test_merge_xla_flags():
    assert numerics.merge_xla_flags(None) == numerics.XLA_FLAG
    assert numerics.merge_xla_flags("--a=1") == f"--a=1 {numerics.XLA_FLAG}"


def test_original_environ_restores_what_was_there_before_the_pin():
    before = numerics._state.get("before", {})
    env = numerics.original_environ()
    for key, value in before.items():
        assert env.get(key) == value
    assert {k: v for k, v in env.items() if k not in before} == {
        k: v for k, v in os.environ.items() if k not in before
    }


def test_a_late_import_warns_and_says_late():
    code = (
        "import warnings, numpy\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import numerics\n"
        "print(numerics.tag()); print(len(w))\n"
    )
    env = {**numerics.original_environ(), "PYTHONPATH": str(ROOT)}
    env.pop(numerics.OPT_OUT_ENV, None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    tag, n = res.stdout.split("\n")[:2]
    if numerics._pinnable() is None:
        assert tag.startswith("late (numpy") and int(n) == 1
    else:
        assert tag.startswith("native")


def test_cpu_flags_read():
    flags = numerics.cpu_flags()
    if Path("/proc/cpuinfo").exists():
        assert "sse2" in flags


def test_emulate_pieces_run_in_one_process_and_name_bad_input(tmp_path):
    cmd, report = emulate.piece_command("llm", tmp_path)
    assert cmd[cmd.index("--jobs") + 1] == "1"  # a spawned worker would escape the emulator
    assert report == tmp_path / "quick" / "sweep" / "results.json"
    assert emulate.piece_command("theory", tmp_path)[1] is None
    with pytest.raises(ValueError, match="piece: expected one of theory, toy, llm, got 'x'"):
        emulate.piece_command("x", tmp_path)
    assert emulate.untimed({"a_seconds": 1, "b": [{"c_seconds": 2, "d": 3}]}) == {"b": [{"d": 3}]}


@needs_pin
@pytest.mark.slow
@pytest.mark.skipif(shutil.which(emulate.QEMU) is None, reason="QEMU's user-mode emulator absent")
def test_the_theory_piece_is_the_same_on_an_emulated_cpu():
    """`python -m numerics.emulate --piece theory` (~30 s): the emulated CPU (no AVX-512) gives
    the native bytes. The other pieces (~3 min emulated) are left to the command."""
    assert emulate.main(["--piece", "theory"]) == 0
