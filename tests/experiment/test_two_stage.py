"""The one study driver (`experiment.two_stage`): a leg that replays a committed study's two stages
from its lift inputs gets the committed picks and verdicts back, the confirmation is asked for
the pass@k picks, and the leg's design, extras and stage clauses land in study.json and
verdicts.md. (Each real leg runs end to end in tests/toymdp/test_study.py and
tests/llm/test_study.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiment import reread, two_stage

FIGURES = Path(__file__).resolve().parents[2] / "figures"


class Replay:
    """A `two_stage.Leg` whose stages are a committed study's lift inputs."""

    unit = "Dataset draws"

    def __init__(self, study: Path) -> None:
        self.study = study
        self.doc = json.loads((study / "study.json").read_text())
        d = self.doc["design"]
        self.spec = two_stage.StudyClaims(
            name=self.doc["study"], claim_size=d["claim_size"],
            claim_size_distinct=d["claim_size_distinct"], alpha=d["alpha"],
        )  # fmt: skip
        self.reading = {k: self.doc["reading"][k]
                        for k in ("reference", "defaults", "problems", "by_step")}  # fmt: skip
        self.budget = (d["budget"], None)
        self.asked: dict = {}

    def _stage(self, stage: str) -> dict:
        return {
            "frontier": reread.sections(reread.load_inputs(self.study / f"{stage}_lift_inputs.npz"))
        }

    def explore(self) -> dict:
        return self._stage("explore")

    def confirm(self, picks):
        self.asked = dict(picks)
        return self._stage("confirm")

    def design(self, confirm) -> dict:
        skip = ("alpha", "claim_size", "claim_size_distinct", "budget")
        return {k: v for k, v in self.doc["design"].items() if k not in skip}

    def stages(self, confirm) -> tuple[str, str]:
        return "the committed exploration", "the committed confirmation"

    def costs(self):
        return self.doc.get("costs")

    def extras(self, explore, confirm) -> dict:
        return {"replayed": str(self.study.name)}


@pytest.mark.parametrize("name", ["toy_study_sharpening", "llm_study_countdown_mild"])
def test_a_replayed_study_gets_its_committed_verdicts(tmp_path, name):
    """A study whose every pick the committed confirmation trained (a pick the procedure in force
    moved to an untrained setting is `pending` in the re-read and leaves its Holm family, which a
    replay cannot do: fig6 and rule have one since lift v6)."""
    leg = Replay(FIGURES / name)
    assert not leg.doc.get("pending"), name
    got = two_stage.run(leg, tmp_path, FIGURES.parent / "pyproject.toml")
    want = leg.doc
    picks = want["picks"]["pass_at_k"]
    assert set(leg.asked) == set(picks)  # the pass@k picks, per label
    for label, p in leg.asked.items():
        assert (p["setting"], p["step"]) == (picks[label]["setting"], picks[label]["step"])
    assert got["claims"] == want["claims"]
    assert got["confirmed"] == want["confirmed"]
    assert got["design"]["budget"] == want["design"]["budget"]
    assert got["replayed"] == name
    written = json.loads((tmp_path / "study.json").read_text())
    assert written["reading"]["how"].startswith("Exploratory stage: the committed exploration; ")
    assert (
        "Confirmation: the committed confirmation; each pick read at its checkpoint."
        in (written["reading"]["how"])
    )
    assert (tmp_path / "verdicts.md").read_text().count("**") > 0


def test_how_names_an_unequal_budget():
    assert two_stage.how("a", "b", None).endswith("(every method at the reference's learning rates, "
                                                  "kl_coef values and checkpoints).")  # fmt: skip
    assert "**unequal** (explicit, [study] unequal_budget = true): lr differs." in two_stage.how(
        "a", "b", "lr differs"
    )
