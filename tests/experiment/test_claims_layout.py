"""The claims table's two layouts (issue 57): README.md's compact one (the word and the lift) and
docs/results.md's full one (intervals and MDEs), both written by ``python -m experiment claims``
from the committed studies, and kept current."""

from __future__ import annotations

import json
from pathlib import Path

from experiment.__main__ import BEGIN, END, main
from experiment.inference import PROCEDURE
from experiment.study_report import claims_table

ROOT = Path(__file__).parents[2]
STUDIES = [*sorted(ROOT.glob("figures/*study*/study.json")), ROOT / "figures/gpu/study.json"]

ROWS = [
    {"study": "toy", "claim": "ds_grpo", "text": "DS-GRPO beats GRPO", "verdict": "not resolved",
     "lift": -1.0, "lo": -2.0, "hi": 0.5, "mde": 1.2, "size": 1.5, "unit": "points"},
    {"study": "toy", "claim": "top_entropy", "text": "the 80/20 mask keeps pass@k",
     "verdict": "smaller than claimed", "lift": 0.044, "lo": 0.034, "hi": 0.053, "mde": 0.018,
     "size": 0.1, "unit": "per problem"},
    {"study": "toy", "claim": "grpo_spread", "text": "GRPO's best setting", "verdict": None,
     "lift": 4.1, "lo": 3.4, "hi": 4.8, "where": "lr=0.1, step 200"},
    {"study": "llm", "claim": "ds_grpo", "text": "DS-GRPO beats GRPO", "verdict": "below GRPO",
     "lift": None, "lo": None, "hi": None, "mde": None, "status": "below_range"},
]  # fmt: skip


def test_the_compact_cell_is_the_word_and_the_lift() -> None:
    full, compact = claims_table(ROWS), claims_table(ROWS, compact=True)
    assert full.splitlines()[0] == compact.splitlines()[0] == "| claim | toy | llm |"
    assert "| DS-GRPO beats GRPO | **not resolved** -1.0 | **below GRPO** |" in compact
    assert "| the 80/20 mask keeps pass@k | **smaller than claimed** +0.044 | — |" in compact
    assert "| GRPO's best setting | +4.1 | — |" in compact
    assert "[-2.0, +0.5], MDE 1.2" in full and "(lr=0.1, step 200)" in full
    assert "MDE" not in compact and "[" not in compact
    assert max(map(len, compact.splitlines())) < max(map(len, full.splitlines()))


def test_readme_gets_the_compact_table_and_results_the_full_one(tmp_path, capsys) -> None:
    study = tmp_path / "study.json"
    study.write_text(json.dumps({"study": "toy", "procedure": PROCEDURE, "claims": ROWS[:2]}))
    readme, results = tmp_path / "README.md", tmp_path / "results.md"
    for page in (readme, results):
        page.write_text(f"top\n{BEGIN}\nold\n{END}\nbottom\n")
    argv = ["claims", str(study), "--readme", str(readme), "--results", str(results)]
    assert main(argv) == 0
    assert (
        readme.read_text() == f"top\n{BEGIN}\n{claims_table(ROWS[:2], compact=True)}{END}\nbottom\n"
    )
    assert results.read_text() == f"top\n{BEGIN}\n{claims_table(ROWS[:2])}{END}\nbottom\n"
    capsys.readouterr()
    assert main(["claims", str(study), "--compact"]) == 0
    assert capsys.readouterr().out == claims_table(ROWS[:2], compact=True)


def test_a_target_without_markers_is_refused_before_anything_is_written(tmp_path, capsys) -> None:
    study = tmp_path / "study.json"
    study.write_text(json.dumps({"study": "toy", "procedure": PROCEDURE, "claims": ROWS[:1]}))
    readme, results = tmp_path / "README.md", tmp_path / "results.md"
    readme.write_text(f"{BEGIN}\nold\n{END}\n")
    results.write_text("no markers\n")
    assert main(["claims", str(study), "--readme", str(readme), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--results" in err and str(results) in err
    assert readme.read_text() == f"{BEGIN}\nold\n{END}\n"  # untouched


def test_the_committed_pages_carry_the_committed_studies_tables(tmp_path) -> None:
    """README.md and docs/results.md are what the command writes from the committed studies."""
    for name in ("README.md", "docs/results.md"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    argv = ["claims", *map(str, STUDIES), "--readme", str(tmp_path / "README.md"),
            "--results", str(tmp_path / "docs/results.md")]  # fmt: skip
    assert main(argv) == 0
    for name in ("README.md", "docs/results.md"):
        assert (tmp_path / name).read_text() == (ROOT / name).read_text(), (
            f"{name}'s claims table is stale: run python -m experiment claims "
            "figures/*study*/study.json figures/gpu/study.json --readme README.md "
            "--results docs/results.md"
        )
