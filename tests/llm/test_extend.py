"""`python -m llm study --extend`: a new method read against a finished LLM study's committed
reference, on a random one-layer model (seconds). Re-deriving a method from the study without it
gives the full study's pick and confirmation bytes; a method defined outside the package trains
in spawned workers; a changed reference run is refused by name."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiment import extend as E
from experiment import study as S
from experiment.reread import load_inputs, reread
from llm.__main__ import main
from llm.eval.frontier import frontier_inputs
from llm.orchestrate.extend import LLMExtension
from llm.orchestrate.jobs import RUN_MARKER
from llm.orchestrate.study_spec import confirmation
from llm.orchestrate.sweep import run_sweep
from tests.llm.test_sweep import BASE

# Each test starts from two whole studies (the `studies` fixture).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
HEAD = """
base = "base.toml"
seeds = [0]
checkpoints = [1, 2]
reference = "grpo"
[eval]
problems = 3
samples = 4
seed = 7
[[methods]]
method = "grpo"
[[methods]]
method = "entropy_bonus"
grid = { eta = [0.1, 0.3] }
"""
W = """
[[methods]]
method = "w_reinforce"
grid = { lam = [0.3] }
"""
STUDY = """
[study]
name = "tiny study"
confirm_seeds = [5]
confirm_problems = 4
"""


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: str) -> dict[str, Path]:
    """A full study (GRPO, entropy bonus, W-REINFORCE) and the same without W-REINFORCE."""
    root = tmp_path_factory.mktemp("llm_extend")
    (root / "base.toml").write_text(BASE.format(model=tiny_model_path))
    out = {}
    for name, body in (("full", HEAD + W), ("without", HEAD)):
        (root / f"{name}.toml").write_text(body + STUDY)
        argv = ["study", "--config", str(root / f"{name}.toml"), "--out", str(root / name)]
        assert main([*argv, "--workers", "1"]) == 0
        out[name] = root / name
    (root / "w.toml").write_text(W)
    out["methods"] = root / "w.toml"
    return out


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def test_rederiving_a_method_gives_the_full_studys_runs(studies, tmp_path, capsys):
    before = _tree(studies["without"])
    out = tmp_path / "ext"
    argv = ["study", "--extend", str(studies["without"]), "--methods", str(studies["methods"])]
    assert main([*argv, "--out", str(out), "--workers", "1"]) == 0
    assert capsys.readouterr().out.startswith("w_reinforce: ")
    assert _tree(studies["without"]) == before
    full = json.loads((studies["full"] / "study.json").read_text())
    ext = json.loads((out / "study.json").read_text())
    # The trust check re-trained the base model's evaluation and one GRPO run: the same bytes.
    trust = json.loads((out / "trust.json").read_text())["runs"]
    assert next(r["run"] for r in trust) == "base" and trust[1]["run"].startswith("grpo")
    assert all(r["committed"] == r["here"] for r in trust)
    # Only the new method was trained: its exploratory runs have the full study's fingerprints.
    explored = {k: v for k, v in full["fingerprints"]["explore"].items() if "w_reinforce" in k}
    assert ext["fingerprints"]["explore"] == {"base": full["fingerprints"]["explore"]["base"],
                                              **explored}  # fmt: skip
    # The same pick (or, as on this random model, none: its runs never left the base).
    assert ("w_reinforce" in ext["picks"]["pass_at_k"]) == (
        "w_reinforce" in full["picks"]["pass_at_k"]
    )
    if "w_reinforce" not in full["picks"]["pass_at_k"]:
        assert ext["unpicked"] == ["w_reinforce"]
        assert ext["confirmed"]["pass_at_k"] == {} and not (out / "confirm").exists()
        return
    mine, theirs = (d["picks"]["pass_at_k"]["w_reinforce"] for d in (ext, full))
    assert (mine["setting"], mine["step"]) == (theirs["setting"], theirs["step"])
    row = next(r for r in ext["claims"] if r["claim"] == "w_reinforce")
    assert row["verdict"] in S.VERDICTS
    assert ext["extends"]["provenance"] == json.loads(
        (studies["without"] / "study.json").read_text())["provenance"]  # fmt: skip


@pytest.mark.usefixtures("registry_snapshot")
def test_a_method_defined_outside_the_package_trains_in_spawned_workers(studies, tmp_path):
    out = tmp_path / "mine"
    argv = ["study", "--extend", str(studies["without"]), "--methods",
            str(ROOT / "examples" / "my_methods.toml"), "--import",
            str(ROOT / "examples" / "my_methods.py"), "--out", str(out), "--workers", "2"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads((out / "study.json").read_text())
    judged = {r["claim"] for r in doc["claims"]} | set(doc["unpicked"])
    assert "centred_ds" in judged
    runs = {k for k in doc["fingerprints"]["explore"] if k.startswith("centred_ds")}
    assert len(runs) == 2  # beta 0.03 and 0.3, seed 0
    # Each of its run folders, written by a worker, records the method's code (the file's SHA-256):
    # an edited file trains again.
    mine = hashlib.sha256((ROOT / "examples" / "my_methods.py").read_bytes()).hexdigest()[:16]
    markers = [json.loads(p.read_text()) for p in out.rglob(RUN_MARKER)
               if p.parent.name.startswith("centred_ds")]  # fmt: skip
    assert len(markers) >= 2 and all(m["method_code"] == mine for m in markers)
    assert doc["provenance"]["method_code"] == {"centred_ds": mine}


def test_a_changed_reference_run_is_refused_by_name(studies, tmp_path, capsys):
    moved = tmp_path / "moved"
    shutil.copytree(studies["without"], moved)
    doc = json.loads((moved / "study.json").read_text())
    run = next(k for k in doc["fingerprints"]["explore"] if k.startswith("grpo"))
    doc["fingerprints"]["explore"][run] = "f" * 64
    (moved / "study.json").write_text(json.dumps(doc))
    argv = ["study", "--extend", str(moved), "--methods", str(studies["methods"]), "--workers", "1"]
    assert main([*argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"reference run {run!r}" in err and "ffffffffffffffff" in err
    assert "--retrain-reference" in err
    assert not (tmp_path / "x" / "study.json").exists()


def test_a_picks_confirmation_at_its_step_alone_has_the_full_confirmations_bytes(studies, tmp_path):
    committed = E.load_committed(studies["without"])
    methods, claims = E.read_methods(studies["methods"])
    leg = LLMExtension(committed, methods, claims, tmp_path / "ext", studies["methods"],
                       {"workers": 1, "progress": False})  # fmt: skip
    pick = {"w_reinforce": {"setting": "lam=0.3", "step": 1, "params": {"lam": 0.3}}}
    got = leg.confirm(pick, retrain=False)["pass_at_k"]
    assert list(zip(got["models"].method, got["models"].step, strict=True)) == [
        ("grpo", 0), ("w_reinforce", 1)]  # fmt: skip
    # The study's own confirmation of that pick evaluates every checkpoint.
    every = run_sweep(confirmation(leg.ext, leg.spec, pick), tmp_path / "every", workers=1,
                      progress=False)  # fmt: skip
    want = frontier_inputs(every)["pass_at_k"]
    j = next(k for k in want["models"].select("w_reinforce") if want["models"].step[k] == 1)
    np.testing.assert_array_equal(got["x"][1], want["x"][j])
    np.testing.assert_array_equal(got["y"][1], want["y"][j])
    assert (
        leg.prints["confirm"]["w_reinforce_lam=0.3_seed5"]
        != every["fingerprints"]["w_reinforce_lam=0.3_seed5"]
    )  # one checkpoint's records, not two: another fingerprint


def _forced(real, eta: float):
    """`experiment.study.pick` with the entropy bonus's pass@k pick forced to `eta` at step 2 (a
    procedure that picks it there)."""

    def pick(found):
        picks = real(found)
        p = {"setting": f"eta={eta}", "step": 2, "params": {"eta": eta}, "lift": 0.0,
             "lift_lo": 0.0, "lift_hi": 0.0}  # fmt: skip
        return {**picks, "pass_at_k": {**picks["pass_at_k"], "entropy_bonus": p}}

    return pick


def test_a_pending_pick_is_confirmed_at_every_checkpoint(studies, tmp_path, monkeypatch, capsys):
    """``--complete``: the confirmation trained the entropy bonus at eta 0.1; the procedure in
    force picks eta 0.3 (pending after a re-read). The completion trains eta 0.3 on the
    confirmation's seeds, evaluates it at every checkpoint as the study would, replaces eta 0.1's
    models, confirmed measures and verdict, and keeps everything else."""
    real = S.pick
    config = Path(
        json.loads((studies["without"] / "study.json").read_text())["provenance"]["config"]
    )
    stale = tmp_path / "stale"
    with monkeypatch.context() as m:
        m.setattr(S, "pick", _forced(real, 0.1))
        assert main(["study", "--config", str(config), "--out", str(stale), "--workers", "1"]) == 0
    monkeypatch.setattr(S, "pick", _forced(real, 0.3))
    doc = reread(stale)
    assert doc["pending"]["entropy_bonus"]["setting"] == "eta=0.3"
    capsys.readouterr()
    out = tmp_path / "completed"
    assert main(["study", "--complete", str(stale), "--out", str(out), "--workers", "1"]) == 0
    assert "wrote" in capsys.readouterr().out
    done = json.loads((out / "study.json").read_text())
    assert "pending" not in done and set(done["completed"]["picks"]) == {"entropy_bonus"}
    assert all(r["committed"] == r["here"] for r in done["completed"]["trust"])
    a = load_inputs(out / "confirm_lift_inputs.npz")["measures"]["pass_at_k"]
    ours = {(s, t) for m, s, t in zip(a["models"].method, a["models"].setting, a["models"].step,
                                      strict=True) if m == "entropy_bonus"}  # fmt: skip
    assert ours == {("eta=0.3", 1), ("eta=0.3", 2)}  # every checkpoint, eta 0.1's gone
    b = load_inputs(stale / "confirm" / "lift_inputs.npz")["measures"]["pass_at_k"]
    for i in b["models"].select("grpo"):  # the committed reference, bit for bit
        j = next(j for j in a["models"].select("grpo") if a["rows"][j] == b["rows"][i])
        np.testing.assert_array_equal(a["x"][j], b["x"][i])
    rows = [r for r in done["measures"] if r["label"] == "entropy_bonus"]
    assert {(r["setting"], r["step"]) for r in rows} == ours
    assert any(k.startswith("entropy_bonus_eta=0.3_seed5") for k in done["fingerprints"]["confirm"])
    row = next(r for r in done["claims"] if r["claim"] == "entropy_bonus")
    assert row["verdict"] in S.VERDICTS
    assert "Picks not confirmed" not in (out / "verdicts.md").read_text()


def test_a_spot_check_retrains_an_extensions_confirmation_runs(studies, tmp_path, capsys):
    """`python -m llm spot-check` of an extension's study.json rebuilds its confirmation from the
    study it extends and its methods file, and re-trains its runs (each pick evaluated at its step
    alone, as the extension did) to the same fingerprints."""
    out = tmp_path / "ext"
    argv = ["study", "--extend", str(studies["without"]), "--methods", str(studies["methods"]),
            "--out", str(out), "--workers", "1"]  # fmt: skip
    assert main(argv) == 0
    path = out / "study.json"
    doc = json.loads(path.read_text())
    spot = ["spot-check", str(path), "--runs", "2", "--out", str(tmp_path / "spot"),
            "--workers", "1"]  # fmt: skip
    if not doc["picks"]["pass_at_k"]:  # this random model's runs never left the base
        capsys.readouterr()
        assert main(spot) == 2
        assert "none of whose methods was picked (w_reinforce)" in capsys.readouterr().err
        # The same study.json with a pick, confirmed by the extension's own code.
        committed = E.load_committed(studies["without"])
        methods, claims = E.read_methods(studies["methods"])
        leg = LLMExtension(committed, methods, claims, tmp_path / "graft", studies["methods"],
                           {"workers": 1, "progress": False})  # fmt: skip
        pick = {"w_reinforce": {"setting": "lam=0.3", "step": 2, "params": {"lam": 0.3}}}
        leg.confirm(pick, retrain=False)
        doc["picks"]["pass_at_k"] = pick
        doc["fingerprints"]["confirm"] = leg.prints["confirm"]
        path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(spot) == 0
    rep = json.loads((tmp_path / "spot" / "spot_check.json").read_text())
    assert rep["same"] == rep["of"] == 2 and rep["runs"][0]["run"] == "base"
    assert "2 of 2 runs identical" in capsys.readouterr().out
    # The study it extends changed since: named, nothing re-trained.
    moved = tmp_path / "moved"
    shutil.copytree(studies["without"], moved)
    doc["extends"]["dir"] = str(moved)
    theirs = json.loads((moved / "study.json").read_text())
    (moved / "study.json").write_text(json.dumps({**theirs, "note": "edited"}))
    path.write_text(json.dumps(doc))
    assert main([*spot[:-4], "--out", str(tmp_path / "spot2")]) == 2
    assert f"the study it extends, {moved}, changed since the extension (study.json)" in (
        capsys.readouterr().err
    )
    # A method imported under other code than the extension ran: named, nothing re-trained.
    doc["extends"]["dir"] = str(studies["without"])
    doc["provenance"]["method_code"] = {"w_reinforce": "0" * 16}
    path.write_text(json.dumps(doc))
    assert main([*spot[:-4], "--out", str(tmp_path / "spot3")]) == 2
    assert "the code of w_reinforce differs from the code the extension ran" in (
        capsys.readouterr().err
    )
