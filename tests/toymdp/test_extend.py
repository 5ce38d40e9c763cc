"""`python -m toymdp study --extend`: a new method read against a finished toy study's committed
reference. Re-deriving a method of a full study from the study without it gives the full study's
pick and confirmation bytes; a method defined outside the package (examples/my_methods.py) runs
end to end; a changed reference is refused by name; the committed folder is never written."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import shaping
from experiment import extend as E
from experiment import reread
from experiment import study as S
from toymdp.__main__ import main

# Each test starts from two whole studies (the `studies` fixture).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
HEAD = """
seeds = [0, 1]
checkpoints = [4, 8, 12]
reference = ["grpo"]
tune = { kl_coef = [0.0, 0.1] }

[env]
kind = "dataset"
num_actions = 3
depth = 2
draws = [0, 1]
skew = 1.0
base_correctness = 0.1
multiplicities = [1, 2, 4]
per_size = 2

[train]
optimizer = "adam"
lr = 0.1
updates = 12
group_size = 4
pass_k = [1, 4, 16]
distinct_k = 8

[frontier]
num_resamples = 200

[[methods]]
method = "grpo"
"""
DS = """
[[methods]]
method = "ds_grpo"
fixed = { gamma_n = 0.0 }
grid = { gamma_p = [0.1, 1.0] }
"""
W = """
[[methods]]
method = "w_reinforce"
grid = { lam = [0.1, 1.0] }
"""
STUDY = """
[study]
name = "tiny toy"
confirm_draws = [10, 11, 12]
confirm_seeds = [0, 1]
confirm_key = 1
"""


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A full study (GRPO, DS-GRPO, W-REINFORCE) and the same without W-REINFORCE."""
    root = tmp_path_factory.mktemp("toy_extend")
    out = {}
    for name, body in (("full", HEAD + DS + W), ("without", HEAD + DS)):
        config = root / f"{name}.toml"
        config.write_text(body + STUDY)
        assert main(["study", "--config", str(config), "--out", str(root / name)]) == 0
        out[name] = root / name
    (root / "w.toml").write_text(W)
    out["methods"] = root / "w.toml"
    return out


def _model(stage: dict, label: str, step: int) -> tuple[np.ndarray, np.ndarray]:
    a = stage["measures"]["pass_at_k"]
    i = [j for j, (m, s) in enumerate(zip(a["models"].method, a["models"].step, strict=True))
         if m == label and s == step]  # fmt: skip
    assert len(i) == 1
    return a["x"][i[0]], a["y"][i[0]]


def test_rederiving_a_method_gives_the_full_studys_pick_and_confirmation(studies, tmp_path):
    before = _tree(studies["without"])
    out = tmp_path / "ext"
    assert main(["study", "--extend", str(studies["without"]), "--methods",
                 str(studies["methods"]), "--out", str(out)]) == 0  # fmt: skip
    assert _tree(studies["without"]) == before  # the committed folder is never written
    full = json.loads((studies["full"] / "study.json").read_text())
    ext = json.loads((out / "study.json").read_text())
    # The same exploratory pick (the full study's, by the same rule; its estimate's draws follow
    # the model set, so the lift itself moves a little) ...
    mine_pick, their_pick = (d["picks"]["pass_at_k"]["w_reinforce"] for d in (ext, full))
    assert {k: mine_pick[k] for k in ("setting", "step", "params")} == {
        k: their_pick[k] for k in ("setting", "step", "params")}  # fmt: skip
    # ... and the same confirmation bytes at its step (the gains of every seed and draw).
    step = full["picks"]["pass_at_k"]["w_reinforce"]["step"]
    mine = reread.load_inputs(out / "confirm_lift_inputs.npz")
    theirs = reread.load_inputs(studies["full"] / "confirm" / reread.INPUTS)
    for a, b in zip(_model(mine, "w_reinforce", step), _model(theirs, "w_reinforce", step),
                    strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)
    # The confirmed lift differs only by the smaller model set (the draws of the other models
    # and Holm's family of one instead of two): the estimate is the same point on the same hull.
    f, e = (d["confirmed"]["pass_at_k"]["w_reinforce"] for d in (full, ext))
    assert e["x"] == f["x"] and e["y"] == f["y"]
    assert abs(e["lift"] - f["lift"]) < 0.25 * f["se"] + 1e-12
    assert e["p_holm"] <= f["p_holm"] + 1e-12  # a family of one adjusts less
    # The extension records what it extends and reads as a study.
    assert ext["extends"]["study"] == "tiny toy" and ext["extends"]["reference"] == "committed"
    assert ext["extends"]["sha256"]["study.json"] == hashlib.sha256(
        (studies["without"] / "study.json").read_bytes()).hexdigest()  # fmt: skip
    rows = {r["claim"]: r for r in ext["claims"]}
    assert rows["w_reinforce"]["verdict"] in S.VERDICTS
    assert "Holm's family is the extension's own" in (out / "verdicts.md").read_text()
    again = reread.reread(out, tmp_path / "again")
    assert again["confirmed"] == ext["confirmed"]
    assert {r["claim"] for r in again["claims"]} == set(rows)


@pytest.mark.usefixtures("registry_snapshot")
def test_a_method_defined_outside_the_package_is_extended(studies, tmp_path, capsys):
    out = tmp_path / "mine"
    code = main(["study", "--extend", str(studies["without"]), "--methods",
                 str(ROOT / "examples" / "my_methods.toml"), "--import",
                 str(ROOT / "examples" / "my_methods.py"), "--out", str(out)])  # fmt: skip
    assert code == 0
    assert "centred_ds" in shaping.METHODS
    again = reread.reread(out, tmp_path / "again")  # its own claim kept (study.json's reading)
    assert any(r["claim"] == "centred_ds" for r in again["claims"])
    printed = capsys.readouterr().out
    assert printed.startswith("centred_ds: ") and "wrote study.json" in printed
    doc = json.loads((out / "study.json").read_text())
    row = next(r for r in doc["claims"] if r["claim"] == "centred_ds")
    assert row["verdict"] in S.VERDICTS and row["text"].startswith("centred_ds beats GRPO")
    assert doc["provenance"]["imports"] == [str(ROOT / "examples" / "my_methods.py")]
    # The method's code as it ran (`shaping.method_code`): the file's SHA-256.
    mine = hashlib.sha256((ROOT / "examples" / "my_methods.py").read_bytes()).hexdigest()[:16]
    assert doc["provenance"]["method_code"] == {"centred_ds": mine}
    assert {"explore_frontier.png", "confirm_lifts.md", "trust.json"} <= set(_tree(out))


def test_a_changed_reference_is_refused_by_name_unless_retrained(studies, tmp_path, capsys):
    moved = tmp_path / "moved"
    shutil.copytree(studies["without"], moved)
    path = moved / "explore" / reread.INPUTS
    stage = reread.load_inputs(path)
    for a in stage["measures"].values():  # GRPO's gains nudged: as another package would
        i = a["models"].select("grpo")
        a["x"][i] += 1e-9
    reread.save_inputs(path, stage["measures"], num_resamples=stage["num_resamples"],
                       seed=stage["seed"], intro=stage["intro"], labels=stage["labels"],
                       title=stage["title"], level=stage["level"])  # fmt: skip
    args = ["study", "--extend", str(moved), "--methods", str(studies["methods"]), "--out"]
    assert main([*args, str(tmp_path / "mixed")]) == 2  # inputs that study.json does not record
    assert "the folder mixes studies" in capsys.readouterr().err
    doc = json.loads((moved / "study.json").read_text())  # as the study another package made
    doc[reread.HASH_KEY]["explore"] = reread.inputs_sha256(path)
    (moved / "study.json").write_text(json.dumps(doc))
    assert main([*args, str(tmp_path / "refused")]) == 2
    *progress, err = capsys.readouterr().err.strip().splitlines()  # the trust run's, then one line
    assert all(line.startswith("toy sweep: ") for line in progress)
    assert err.startswith("error: ") and "reference run 'grpo" in err and "fingerprint" in err
    assert "--retrain-reference" in err
    trust = json.loads((tmp_path / "refused" / "trust.json").read_text())["runs"][0]
    assert err.count(trust["here"][:16]) == 1 and err.count(trust["committed"][:16]) == 1
    assert not (tmp_path / "refused" / "study.json").exists()
    assert main([*args, str(tmp_path / "retrained"), "--retrain-reference"]) == 0
    doc = json.loads((tmp_path / "retrained" / "study.json").read_text())
    assert doc["extends"]["reference"] == "re-trained in full"
    assert "re-trained in full" in (tmp_path / "retrained" / "verdicts.md").read_text()


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        ('seeds = [3]\n[[methods]]\nmethod = "w_reinforce"\n', "unknown key(s) ['seeds']"),
        ('[[methods]]\nmethod = "grpo"\n', "['grpo'] is the study's reference label"),
        ('[[methods]]\nmethod = "no_such"\n', "methods[0].method: expected one of"),
        (
            '[[methods]]\nmethod = "w_reinforce"\n[[methods]]\nmethod = "no_such"\n',
            "methods[1].method: expected one of",
        ),  # its place in this file, not in the study's
        ('[[methods]]\nmethod = "w_reinforce"\nlabel = "a b"\n', "methods[0].label"),
        ("methods = 3\n", "methods: expected [[methods]] tables, got 3"),
        ('[[methods]]\nmethod = "w_reinforce"\nclaim = "pass1"\n', "methods[0].claim"),
        ("", "no [[methods]] table"),
        ('[[methods]]\nmethod = "w_reinforce"\ngrid = { lam = [-1.0] }\n', "lam"),
    ],
)
def test_bad_methods_files_are_named(studies, tmp_path, capsys, methods, message):
    path = tmp_path / "m.toml"
    path.write_text(methods)
    code = main(["study", "--extend", str(studies["without"]), "--methods", str(path), "--out",
                 str(tmp_path / "x")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and message in err and str(path) in err, err


def test_the_committed_folder_and_a_changed_config_are_refused(studies, tmp_path, capsys):
    args = ["study", "--extend", str(studies["without"]), "--methods", str(studies["methods"])]
    assert main([*args, "--out", str(studies["without"])]) == 2
    assert "is in the committed study's folder" in capsys.readouterr().err
    assert main([*args, "--out", str(studies["without"] / "ext")]) == 2
    assert "is in the committed study's folder" in capsys.readouterr().err
    assert not (studies["without"] / "ext").exists()
    assert main(["study", "--methods", str(studies["methods"]), "--config", "x.toml"]) == 2
    assert "only with --extend" in capsys.readouterr().err
    moved = tmp_path / "moved"
    shutil.copytree(studies["without"], moved)
    doc = json.loads((moved / "study.json").read_text())
    config = tmp_path / "changed.toml"
    config.write_text(Path(doc["provenance"]["config"]).read_text().replace("seeds = [0, 1]",
                                                                            "seeds = [0, 2]"))  # fmt: skip
    doc["provenance"]["config"] = str(config)
    (moved / "study.json").write_text(json.dumps(doc))
    assert main(["study", "--extend", str(moved), "--methods", str(studies["methods"]),
                 "--out", str(tmp_path / "y")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "its content changed since the study" in err and str(config) in err


def test_merge_keeps_the_committed_reference_and_the_new_models():
    models = E.frontier.Models(["grpo", "grpo", "a"], ["base", "s", "x"], [0, 4, 4])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, 3, 2, 5))
    rows = [{"label": m} for m in models.method]
    committed = {"measures": {"pass_at_k": {"x": x, "y": y, "models": models, "rows": rows,
                                            "reference": ["grpo"], "k": 4}},
                 "num_resamples": 20, "seed": 0, "level": 0.95}  # fmt: skip
    new_models = E.frontier.Models(["grpo", "b"], ["base", "z"], [0, 8])
    nx, ny = rng.normal(size=(2, 2, 2, 5))
    new = {"pass_at_k": {"x": nx, "y": ny, "models": new_models, "rows": [{}, {}],
                         "reference": ["grpo"], "k": 4}}  # fmt: skip
    out = E.merge(committed, new, ["grpo"])["measures"]["pass_at_k"]
    assert list(out["models"].method) == ["grpo", "grpo", "b"]
    np.testing.assert_array_equal(out["x"], np.concatenate([x[:2], nx[1:]]))
    with pytest.raises(ValueError, match="differ from the committed"):
        E.merge(committed, {"pass_at_k": {**new["pass_at_k"], "x": nx[:, :1]}}, ["grpo"])


def test_a_study_of_the_other_leg_is_named_with_the_command_that_extends_it(tmp_path, capsys):
    """Each leg's ``--extend`` refuses the other leg's committed study before parsing its config
    (whose keys the leg does not know), saying which command extends it."""
    from llm.__main__ import main as llm_main

    root = Path(__file__).parents[2] / "figures"
    methods = Path(__file__).parents[2] / "examples" / "my_methods.toml"
    for command, folder in ((main, "llm_study_countdown_rule"), (llm_main, "toy_study_sharpening")):
        argv = ["study", "--extend", str(root / folder), "--methods", str(methods), "--out",
                str(tmp_path / folder)]  # fmt: skip
        assert command(argv) == 2
        err = capsys.readouterr().err
        assert "is a study of the other leg" in err and "python -m toymdp study --extend" in err
        assert not (tmp_path / folder).exists()


def test_a_pending_pick_is_confirmed_and_the_study_reads_as_the_full_one(
    studies, tmp_path, monkeypatch, capsys
):
    """``--complete``: a study whose confirmation trained a setting of W-REINFORCE that the
    procedure in force no longer picks (as after a re-read by a later procedure) gets the pick's
    confirmation and reads as the study run in full by that procedure: the same models, lifts,
    Holm-adjusted p-values and words."""
    full = json.loads((studies["full"] / "study.json").read_text())
    best = full["picks"]["pass_at_k"]["w_reinforce"]
    lam = best["params"]["lam"]
    other = 1.0 if lam == 0.1 else 0.1
    real_pick = S.pick

    def earlier(found):  # an earlier procedure's pick: W-REINFORCE's other setting
        picks = real_pick(found)
        p = dict(picks["pass_at_k"]["w_reinforce"])
        p["params"] = {**p["params"], "lam": other}
        p["setting"] = p["setting"].replace(f"lam={lam:g}", f"lam={other:g}")
        return {**picks, "pass_at_k": {**picks["pass_at_k"], "w_reinforce": p}}

    stale = tmp_path / "stale"
    config = Path(full["provenance"]["config"])
    # The stale study's exploration is the full study's (same config, same code): its cached
    # sweep (keyed by both) is reused; its confirmation, of the earlier pick, is trained here.
    (stale / "explore" / ".cache").mkdir(parents=True)
    for npz in (studies["full"] / "explore" / ".cache").glob("sweep-*.npz"):
        shutil.copy(npz, stale / "explore" / ".cache" / npz.name)
    with monkeypatch.context() as m:
        m.setattr(S, "pick", earlier)
        assert main(["study", "--config", str(config), "--out", str(stale)]) == 0
    doc = reread.reread(stale)  # by the procedure in force: W-REINFORCE's pick is pending
    assert set(doc["pending"]) == {"w_reinforce"}
    assert not any(r["verdict"] for r in doc["claims"] if r["claim"] == "w_reinforce")
    capsys.readouterr()
    before = _tree(stale)
    out = tmp_path / "completed"
    assert main(["study", "--complete", str(stale), "--out", str(out)]) == 0
    assert "wrote study.json" in capsys.readouterr().out
    assert _tree(stale) == before  # the committed folder is never written
    done = json.loads((out / "study.json").read_text())
    assert "pending" not in done and set(done["completed"]["picks"]) == {"w_reinforce"}
    assert done["reread"]["from"] == doc["reread"]["from"]  # the re-reads' history kept
    # The pick's confirmation has the full study's bytes; the stale setting's models are gone.
    mine = reread.load_inputs(out / "confirm_lift_inputs.npz")
    theirs = reread.load_inputs(studies["full"] / "confirm" / reread.INPUTS)
    for measure, a in mine["measures"].items():
        b = theirs["measures"][measure]
        assert list(a["models"].method) == list(b["models"].method)
        assert list(a["models"].step) == list(b["models"].step)
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])
    for key in ("picks", "confirmed", "claims"):
        assert done[key] == full[key], key
    # A completed study re-reads as itself, with nothing pending.
    again = reread.reread(out, tmp_path / "again")
    assert "pending" not in again and again["claims"] == done["claims"]
    assert again["completed"] == done["completed"]
    # Nothing pending, or flags that do not go with --complete: one line each.
    assert main(["study", "--complete", str(out), "--out", str(tmp_path / "none")]) == 2
    assert "no pending pick" in capsys.readouterr().err
    assert main(["study", "--complete", str(stale), "--config", str(config)]) == 2
    assert "drop --config" in capsys.readouterr().err
    assert main(["study", "--complete", str(stale), "--out", str(stale / "x")]) == 2
    assert "is in the committed study's folder" in capsys.readouterr().err
