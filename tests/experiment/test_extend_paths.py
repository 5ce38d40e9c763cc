"""A committed study is extended from a folder of one's own: the relative config path its
provenance records is read from the current folder, else from the folders above the study
(`experiment.extend.check_config`). The end-to-end extensions are in tests/toymdp/test_extend.py
and tests/llm/test_extend.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import numerics
from experiment import extend as E

ROOT = Path(__file__).parents[2]
STUDIES = ("toy_study_sharpening", "llm_study_countdown_rule")


@pytest.mark.parametrize("study", STUDIES)
def test_a_committed_study_loads_from_a_folder_of_ones_own(study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the checkout's is found above the study
    committed = E.load_committed(ROOT / "figures" / study)
    recorded = json.loads((ROOT / "figures" / study / "study.json").read_text())["provenance"]
    assert committed.config == ROOT / recorded["config"]
    monkeypatch.chdir(ROOT)  # from the root, the path as the study recorded it
    assert E.load_committed(Path("figures") / study).config == Path(recorded["config"])


def test_a_config_found_nowhere_is_named_with_the_folders_read(tmp_path, monkeypatch):
    moved = tmp_path / "study"  # a copy outside the checkout: no folder above holds its config
    shutil.copytree(ROOT / "figures" / "toy_study_sharpening", moved)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        E.load_committed(moved)
    assert str(moved / "study.json") in str(err.value)
    assert "'configs/toy/study_sharpening.toml' does not exist" in str(err.value)
    assert "folders above the study" in str(err.value)


def test_a_changed_config_above_the_study_is_refused(tmp_path, monkeypatch):
    tree = tmp_path / "tree"  # the study and its config in a tree of their own, the config edited
    shutil.copytree(ROOT / "figures" / "toy_study_sharpening", tree / "figures" / "s")
    config = tree / "configs" / "toy" / "study_sharpening.toml"
    config.parent.mkdir(parents=True)
    text = (ROOT / "configs/toy/study_sharpening.toml").read_text()
    config.write_text(text.replace("seeds = [0, 1, 2, 3]", "seeds = [0, 1, 2]", 1))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="its content changed since the study") as err:
        E.load_committed(tree / "figures" / "s")
    assert str(config) in str(err.value)


def test_a_failed_trust_check_names_the_pin_that_reproduces_the_study(monkeypatch):
    """A study made under another numerics version fails the trust check by its arithmetic, not
    by a bug: the message names the ``SHARPENING_NUMERICS`` that reproduces it."""
    rows = [{"run": "grpo_seed0", "committed": "a" * 64, "here": "b" * 64}]
    E.check_trust([{**rows[0], "here": "a" * 64}], "s")  # the same fingerprint: trusted
    monkeypatch.setitem(numerics._state, "tag", "pinned avx2 v3")
    with pytest.raises(ValueError, match=r"'pinned avx2 v2'.*SHARPENING_NUMERICS=pinned-v2 set "
                       r"before Python starts, or pass --retrain-reference"):  # fmt: skip
        E.check_trust(rows, "s", "pinned avx2 v2")
    for recorded in (None, "pinned avx2 v3", "native (opted out): not byte-comparable"):
        with pytest.raises(ValueError, match=r"^s: reference run 'grpo_seed0'") as err:
            E.check_trust(rows, "s", recorded)
        assert "SHARPENING_NUMERICS" not in str(err.value)
        assert "cannot stand for a re-run: pass --retrain-reference" in str(err.value)


class _Stop(Exception):
    pass


class _Leg:
    """An extension leg that records the numerics of its trust check and stops at exploration."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, str | None]] = []

    def trust(self) -> list[dict[str, str]]:
        self.seen.append((numerics.version(), numerics.tag(), os.environ.get(numerics.OPT_OUT_ENV)))
        return []

    def explore(self, retrain: bool) -> None:
        raise _Stop


@pytest.mark.parametrize("study", STUDIES)
def test_an_extension_trains_under_the_committed_studys_arithmetic(study, tmp_path, monkeypatch,
                                                                   capsys):  # fmt: skip
    """The committed studies ran under ``pinned avx2 v2``: a version-3 process extends them under
    version 2's arithmetic (same pins), its children too, and says so; afterwards it is back."""
    monkeypatch.setattr(numerics, "_state", dict(numerics._state))
    monkeypatch.delenv(numerics.OPT_OUT_ENV, raising=False)
    numerics._state.update(pinned=True, version=3, tag="pinned avx2 v3")
    committed = E.load_committed(ROOT / "figures" / study)
    assert committed.doc["provenance"]["numerics"] == "pinned avx2 v2"
    leg = _Leg()
    with pytest.raises(_Stop):
        E.run(leg, committed, tmp_path / "out", methods_path=tmp_path / "m.toml")
    assert leg.seen == [(2, "pinned avx2 v2", "pinned-v2")]
    assert "the study ran under 'pinned avx2 v2'; computing under it (SHARPENING_NUMERICS=" \
           "pinned-v2), not 'pinned avx2 v3'" in capsys.readouterr().err  # fmt: skip
    assert numerics.version() == 3 and numerics.OPT_OUT_ENV not in os.environ
