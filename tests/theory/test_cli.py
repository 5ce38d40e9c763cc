"""Smoke tests of `python -m theory check`: the JSON contract, exit codes, and `--out`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from theory.__main__ import main
from theory.checks import CHECKERS, CheckResult, register
from theory.checks._registry import CHECKERS as REGISTRY

EXPECTED = {
    "lemma_b1",
    "prop_b2_selection_bias",
    "prop_b3_reinforcement_bias",
    "lemma_b4",
    "lemma_b5",
    "eq19_anchor_equivalence",
    "thm_3_4_kl",
    "thm_3_4_kl_reverse",
    "thm_3_4_chi2",
    "thm_3_4_chi2_reverse",
    "dsdr_prop_c2",
    "dsdr_lemma_c3",
    "dsdr_prop_c4",
    "dsdr_prop_c5",
    "dsdr_thm_3_1",
    "casp_lemma_2",
    "casp_prop_3",
    "progrpo_lemma_a1",
    "progrpo_thm_a2",
}
KEYS = {"name", "source", "status", "trials", "violations", "max_residual"}


def test_every_issue_checker_is_registered():
    assert EXPECTED <= set(CHECKERS)


def test_full_run_as_a_subprocess_lists_every_checker_in_json():
    proc = subprocess.run(
        [sys.executable, "-m", "theory", "check", "--trials", "1", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {r["name"] for r in rows} == set(CHECKERS)
    for row in rows:
        assert KEYS <= set(row)
        assert row["status"] in {"holds", "counterexample"}
        assert row["trials"] == 1 and row["violations"] == 0


def test_out_writes_the_json_rows(tmp_path, capsys):
    out = tmp_path / "sub" / "check.json"
    assert main(["check", "--only", "dsdr_lemma_c3", "--trials", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["name"] for r in rows] == ["dsdr_lemma_c3"]
    assert "dsdr_lemma_c3" in capsys.readouterr().out


def test_unknown_checker_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", "--only", "no_such_theorem"])
    assert exc.value.code == 2
    assert "lemma_b1" in capsys.readouterr().err  # the known names are listed


def test_a_violation_exits_1(capsys):
    @register("_always_violated", source="test", claim="a claim that fails", trials=1)
    def _bad(rng, trials):
        return CheckResult(trials=trials, violations=trials, max_residual=1.0)

    try:
        assert main(["check", "--only", "_always_violated"]) == 1
        assert "_always_violated" in capsys.readouterr().out
    finally:
        del REGISTRY["_always_violated"]


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="already registered"):
        register("lemma_b1", source="x", claim="y")(lambda rng, trials: CheckResult(trials))


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--trials", "0", "--trials must be >= 1, got 0"),
        ("--seed", "-1", "--seed must be >= 0, got -1"),
    ],
)
def test_a_count_or_seed_out_of_range_is_refused_by_name(capsys, flag, value, message):
    with pytest.raises(SystemExit):
        main(["check", "--only", "lemma_b1", flag, value])
    assert message in capsys.readouterr().err
