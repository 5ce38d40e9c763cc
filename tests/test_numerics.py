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
from experiment import study_report as R
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


def other_vendor_cpu() -> str:
    """QEMU's CPU model of the vendor this machine is not: Intel's ``Haswell`` on an AMD host,
    else QEMU's AMD ``max`` (MKL picks kernels by vendor: docs/numerics.md)."""
    return "Haswell" if R.cpu_id().startswith("AuthenticAMD") else "max"


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
    with pytest.raises(ValueError, match="'pinned-v1', 'pinned-v2', 'pinned-v3' or 'native'"):
        numerics.pin({numerics.OPT_OUT_ENV: "pinned-v9"})


def test_an_earlier_version_pins_its_own_values(monkeypatch):
    """``SHARPENING_NUMERICS=pinned-v1`` pins version 1 (MKL's AVX2 branch, the same bytes only
    among CPUs of one vendor) and says so in the tag; the default is `VERSION`, MKL's one branch
    for every x86-64 CPU."""
    monkeypatch.setattr(numerics, "_state", dict(numerics._state))
    assert numerics.PINNED_ENV is numerics.PINS[numerics.VERSION]
    assert numerics.PINS[2]["MKL_CBWR"] == "COMPATIBLE" and numerics.PINS[1]["MKL_CBWR"] == "AVX2"
    assert numerics.PINS[3] == numerics.PINS[2]  # version 3 changes the arithmetic, not the pins
    for mode, version in (("pinned-v1", 1), ("pinned-v2", 2), ("pinned", numerics.VERSION)):
        env = {numerics.OPT_OUT_ENV: mode}
        numerics.pin(env)
        assert env["MKL_CBWR"] == numerics.PINS[version]["MKL_CBWR"]
        assert numerics.tag() == f"pinned {numerics.LEVEL} v{version}"
        assert numerics.setting_for(numerics.tag()) == f"pinned-v{version}"
        assert numerics.version() == numerics.version_of(numerics.tag()) == version
        exact = version >= numerics.EXACT_CENTRING
        assert numerics.same_arithmetic("pinned avx2 v2") is not exact
        assert numerics.same_arithmetic("pinned avx2 v3") is exact
    native = "native (opted out): not byte-comparable"
    assert numerics.setting_for(native) is None and numerics.same_arithmetic(native) is None
    numerics.pin({numerics.OPT_OUT_ENV: "native"})
    assert numerics.version() == numerics.VERSION  # not pinned: the newest arithmetic


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


# torch's kernels that MKL's AVX2 branch (pin version 1) ran differently on Intel and AMD CPUs:
# GEMMs large and small, a batched GEMM, SDPA at the tiny model's shapes, exp (docs/numerics.md).
# Importing torch under QEMU is most of the time, so one process imports it and forks a child per
# pin version; the child sets the version's ``MKL_CBWR`` before its first MKL call (MKL reads it
# then). Were MKL's branch fixed before the fork, the two versions would give the same bytes on
# both CPUs and one of the test's assertions would fail.
KERNELS = """
import numerics, hashlib, os, torch
import torch.nn.functional as F
torch.set_num_threads(1)

def kernels():
    g = torch.Generator().manual_seed(0)
    out = []
    for m, k, n in [(256, 128, 512), (1024, 128, 128), (8, 16, 8), (7, 33, 129)]:
        a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        out += [a @ b, torch.bmm(a.expand(3, m, k).contiguous(), b.expand(3, k, n).contiguous())]
    for shape in [(32, 2, 8, 16), (4, 2, 30, 16)]:
        q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
        out += [F.scaled_dot_product_attention(q, k, v, is_causal=True)]
    out += [torch.randn(4096, generator=g).exp(), torch.randn(1920, generator=g).exp()]
    return [hashlib.sha256(t.numpy().tobytes()).hexdigest()[:12] for t in out]

print(numerics.tag(), flush=True)
for version in sorted(numerics.PINS):
    pid = os.fork()
    if pid == 0:
        os.environ["MKL_CBWR"] = numerics.PINS[version]["MKL_CBWR"]
        print(version, kernels(), flush=True)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
"""


@needs_pin
@pytest.mark.slow
@pytest.mark.skipif(shutil.which(emulate.QEMU) is None, reason="QEMU's user-mode emulator absent")
def test_torch_kernels_are_the_same_on_an_emulated_cpu_of_the_other_vendor():
    """GEMMs, SDPA and exp give this CPU's bytes on a QEMU CPU of the other vendor (Intel's
    ``Haswell`` on an AMD host, else QEMU's AMD ``max``; ~20 s). Under pin version 1 (MKL's AVX2
    branch, chosen by vendor) the two CPUs' bytes differ: the check can fail. (The spot check's
    emulation test runs a whole training run on that CPU too: tests/llm/test_study.py.)"""
    env = emulate.piece_env()
    env[numerics.OPT_OUT_ENV] = "pinned"
    other = other_vendor_cpu()
    runs = {}
    for cpu in (None, other):
        prefix = [emulate.QEMU, "-cpu", cpu] if cpu else []
        res = subprocess.run([*prefix, sys.executable, "-c", KERNELS], env=env,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        tag, *rows = res.stdout.splitlines()
        assert tag == f"pinned avx2 v{numerics.VERSION}"
        assert len(rows) == len(numerics.PINS), res.stdout
        for row in rows:
            version, hashes = row.split(" ", 1)
            runs[int(version), cpu] = hashes
    v = numerics.VERSION
    assert runs[v, None] == runs[v, other]
    assert runs[1, None] != runs[1, other]  # MKL's AVX2 branch by vendor


def test_threads_wait_passively_only_beside_busy_cores():
    def never():
        raise AssertionError("measured though the choice was made")

    env: dict[str, str] = {}
    assert numerics.choose_wait_policy(env, busy=lambda: 1.0).startswith("passive (1.0")
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {}
    assert numerics.choose_wait_policy(env, busy=lambda: 0.1).startswith("active (0.1")
    assert numerics.choose_wait_policy(env, busy=lambda: None) == "active" and env == {}
    for preset in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "1000"}):
        env = dict(preset)
        assert numerics.choose_wait_policy(env, busy=never) == "set by the environment"
        assert env == preset
    env = {numerics.WAIT_ENV: "passive"}
    assert numerics.choose_wait_policy(env, busy=never) == "passive"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    env = {numerics.WAIT_ENV: "active"}
    assert numerics.choose_wait_policy(env, busy=never).startswith("active")
    assert "OMP_WAIT_POLICY" not in env
    with pytest.raises(ValueError, match="SHARPENING_WAIT='spin'"):
        numerics.choose_wait_policy({numerics.WAIT_ENV: "spin"}, busy=never)


def test_busy_cores_reads_the_share_of_busy_jiffies():
    readings = iter([(100, 1_000), (150, 1_100)])
    n = numerics.busy_cores(0.0, sample=lambda: next(readings), sleep=lambda s: None)
    assert n == pytest.approx(0.5 * (os.cpu_count() or 1))
    assert numerics.busy_cores(0.0, sample=lambda: None, sleep=lambda s: None) is None
    real = numerics.busy_cores(0.05)
    assert real is None or 0.0 <= real <= (os.cpu_count() or 1) + 1e-9


_WARM = """
import hashlib, dataclasses
import numerics
from llm.model import tiny as T
cfg = dataclasses.replace(T.TinyConfig(), epochs=1, num_train_problems=16)
tok = T.build_tokenizer(cfg.max_target)
model = T.build_tiny_model(tok, seed=cfg.model_seed, hidden_size=cfg.hidden_size,
    num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
    intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position_embeddings)
T.warm_start(model, tok, T.tiny_problems(cfg, "train", cfg.num_train_problems), config=cfg,
             num_threads=2, progress=False)
print(numerics.wait_policy())
print(hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
"""


@pytest.mark.slow
def test_the_wait_policy_changes_no_byte():
    """The base model's warm start on 2 threads, spinning and passive: the same weights (the
    choice is free for speed; `bench/bench_load.py` times it)."""
    out = {}
    for mode in ("active", "passive"):
        env = {
            k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
        }
        env.update({numerics.WAIT_ENV: mode, "PYTHONPATH": str(ROOT)})
        res = subprocess.run([sys.executable, "-c", _WARM], env=env, capture_output=True,
                             text=True, cwd=ROOT)  # fmt: skip
        assert res.returncode == 0, res.stderr
        policy, digest = res.stdout.strip().split("\n")[-2:]
        assert policy.startswith(mode)
        out[mode] = digest
    assert out["active"] == out["passive"]


def test_following_a_recorded_version_switches_only_the_arithmetic(monkeypatch):
    """`numerics.following` computes as an output recorded under another version did where the
    pins are this process's (versions 2 and 3), for the block only, children included through
    ``SHARPENING_NUMERICS``; a choice set there, another version's pins, or a tag of no version
    change nothing."""
    monkeypatch.setattr(numerics, "_state", dict(numerics._state))
    monkeypatch.delenv(numerics.OPT_OUT_ENV, raising=False)
    numerics._state.update(pinned=True, version=3, tag="pinned avx2 v3")
    with numerics.following("pinned avx2 v2") as tag:
        assert tag == numerics.tag() == "pinned avx2 v2" and numerics.version() == 2
        assert os.environ[numerics.OPT_OUT_ENV] == "pinned-v2"
    assert numerics.tag() == "pinned avx2 v3" and numerics.version() == 3
    assert numerics.OPT_OUT_ENV not in os.environ
    for recorded in ("pinned avx2 v1", "pinned avx2 v3", "native (opted out): not byte-comparable",
                     None):  # fmt: skip
        with numerics.following(recorded) as tag:
            assert tag == "pinned avx2 v3" and numerics.version() == 3
    monkeypatch.setenv(numerics.OPT_OUT_ENV, "pinned")  # the user's choice stands
    with numerics.following("pinned avx2 v2") as tag:
        assert tag == "pinned avx2 v3"
    monkeypatch.delenv(numerics.OPT_OUT_ENV)
    numerics._state.update(pinned=False, tag="native (opted out): not byte-comparable")
    with numerics.following("pinned avx2 v2") as tag:  # not pinned: nothing to follow
        assert numerics.version() == 3
