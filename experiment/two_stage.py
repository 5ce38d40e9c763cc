"""One driver for a two-stage study of either leg: explore, pick, confirm, conclude.

A study file is a leg's sweep file plus a ``[study]`` table (`read_study`): the confirmation's
fresh seeds and problems, a claim's size and the family-wise level (`StudyClaims` and the leg's
keys). The stages (`run`; `experiment.study` decides):

1. **explore**: the sweep as written, every run read at every checkpoint (a method is
   early-stopped as GRPO is); per method label, the (setting, checkpoint) with the largest
   (bias-corrected) estimate of its pass@k lift (`experiment.study.pick`). Every method must get
   the tuning of GRPO's reference (its learning rates, ``kl_coef`` values and checkpoints: the
   leg's ``budgets``, checked by `study_budget`; a top-level ``tune`` table gives it to all),
   unless ``unequal_budget = true`` says otherwise, which study.json's ``design.budget`` records;
2. **confirm**: the reference entries as written plus one entry per pick (its setting, tuning
   values included), trained on fresh seeds and evaluated on fresh problems; each pick read at
   its picked checkpoint, Holm over the picks, the minimum detectable lift, and the verdict of
   every claim of `experiment.study.CLAIMS` whose method the study has
   (`experiment.study.conclude`).

A leg (`toymdp.study` for tabular policies, `llm.orchestrate.study` for language models)
implements `Leg`: it trains and evaluates a stage's runs and describes its design. The driver does
the rest, the same for both: the picks, the verdicts, the design paragraph of verdicts.md (`how`)
and study.json / verdicts.md (`experiment.reread.write_study`).

Sources: docs/statistics.md (the two-stage design, equal budgets, the verdict words).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numerics
from experiment import schema
from experiment import study as S
from experiment import study_report as R
from experiment.reread import write_study
from experiment.schema import option
from experiment.spec import Budget, check_budget

__all__ = ["Leg", "StudyClaims", "how", "read_study", "run", "study_budget"]


@dataclass(frozen=True)
class StudyClaims:
    """The ``[study]`` keys both legs share: the study's name and how a confirmed lift becomes a
    verdict (a leg's own table adds its confirmation keys and may give other defaults)."""

    name: str = "study"
    """the study's name in the tables"""
    claim_size: float = option(3.0, gt=0)
    """a claim's size: points of pass@k (MDE goal)"""
    claim_size_distinct: float = option(0.1, gt=0)
    """a claim's size in distinct correct / problem"""
    alpha: float = option(0.05, gt=0, lt=1)
    """family-wise level of Holm over the picks"""
    unequal_budget: bool = False
    """allow a method tuned otherwise than GRPO's reference (learning rates, kl_coef, checkpoints);
    study.json's design.budget then says 'unequal (explicit)'"""


C = TypeVar("C", bound=StudyClaims)


def read_study(path: Path, spec_cls: type[C]) -> tuple[dict[str, Any], C]:
    """The study file at `path`: its sweep document (the file without ``[study]``) and its
    ``[study]`` table as `spec_cls` (`experiment.schema.build`). The leg checks the rest.

    Raises:
        ValueError: ``PATH, line N: study.KEY ...`` for a bad ``[study]`` key or value (the
            line that sets it, `experiment.schema.config_error`); ``PATH: no
            [study] table`` for a file without one (a sweep file is not a study with defaults).
    """
    doc = dict(schema.read_toml(path))
    if "study" not in doc:
        raise ValueError(f"{path}: no [study] table (a study file is a sweep file plus [study]; "
                         "a sweep alone runs with the sweep command)")  # fmt: skip
    try:
        return doc, schema.build(spec_cls, "study", doc.pop("study", {}))
    except ValueError as err:
        raise schema.config_error(path, err) from None


def study_budget(
    rows: Sequence[Budget], reference: Sequence[str], spec: StudyClaims, path: Path | None = None
) -> tuple[str, str | None]:
    """The study's tuning budget over a leg's `rows` (`experiment.spec.check_budget`) and, when
    it is unequal and ``spec.unequal_budget`` allows it, how.

    Raises:
        ValueError: a method tuned otherwise than the `reference` without ``unequal_budget``
            (``PATH: study: ...`` when `path` is given).
    """
    try:
        return check_budget(rows, reference, unequal=spec.unequal_budget)
    except ValueError as err:
        raise ValueError(f"{path}: study: {err}" if path else str(err)) from None


class Leg(Protocol):
    """What a leg gives the driver (`run`)."""

    spec: StudyClaims
    """its ``[study]`` table"""
    unit: str
    """the problem unit of the lift, capitalized ("Problems", "Dataset draws")"""
    reading: Mapping[str, Any]
    """`experiment.study.conclude`'s ``reference``, ``defaults``, ``problems``, ``by_step``"""
    budget: tuple[str, str | None]
    """`experiment.spec.check_budget`'s (budget, how it is unequal or None)"""

    def explore(self) -> Mapping[str, Any]:
        """Train and evaluate the exploratory stage; its results, with ``frontier`` (per measure,
        `experiment.report.lift_analysis`'s section)."""
        ...

    def confirm(self, picks: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
        """Train and evaluate the confirmation of the pass@k `picks` (per label) and GRPO's
        reference on fresh seeds and problems; its results, with ``frontier``."""
        ...

    def design(self, confirm: Mapping[str, Any]) -> dict[str, Any]:
        """study.json's ``design`` (seeds, problems, checkpoints of both stages), without
        ``budget``."""
        ...

    def stages(self, confirm: Mapping[str, Any]) -> tuple[str, str]:
        """The design paragraph's two clauses: what the exploration trained and read, and what
        the confirmation re-trained and evaluated (`how`)."""
        ...

    def costs(self) -> Mapping[str, Any] | None:
        """The cost model of `experiment.study.design_for` (or None)."""
        ...

    def extras(self, explore: Mapping[str, Any], confirm: Mapping[str, Any]) -> dict[str, Any]:
        """study.json's entries of this leg alone (e.g. ``measures``, ``fingerprints``)."""
        ...


def how(explored: str, confirmed: str, unequal: str | None) -> str:
    """The design paragraph of verdicts.md: the exploration (`explored`), the pick rule, the
    confirmation (`confirmed`) and the tuning budgets (`unequal`: how they differ, or None)."""
    budget = (
        "equal (every method at the reference's learning rates, kl_coef values and checkpoints)."
        if unequal is None
        else f"**unequal** (explicit, [study] unequal_budget = true): {unequal}."
    )
    return (f"Exploratory stage: {explored}; per method the (setting, checkpoint) with the largest "
            f"(bias-corrected) estimate of its pass@k lift. Confirmation: {confirmed}; each pick "
            f"read at its checkpoint. Tuning budgets: {budget}")  # fmt: skip


def run(leg: Leg, out: str | Path, config_path: str | Path) -> dict[str, Any]:
    """Both stages of `leg`'s study (module docstring), written into `out` (study.json,
    verdicts.md; the stages' folders are the leg's); returns study.json's dict. Provenance: the
    config at `config_path`, the git commit, the CPU, the numerics pin
    (`experiment.study_report.provenance`)."""
    explore = leg.explore()
    picks = S.pick(explore["frontier"])
    confirm = leg.confirm(picks["pass_at_k"])
    budget, unequal = leg.budget
    c = leg.spec
    result = S.conclude(
        c.name, picks, confirm["frontier"], alpha=c.alpha, size=c.claim_size,
        size_distinct=c.claim_size_distinct, design={**leg.design(confirm), "budget": budget},
        provenance=R.provenance(Path(config_path), numerics.tag()), costs=leg.costs(),
        **leg.reading,
    )  # fmt: skip
    result.update(leg.extras(explore, confirm))
    write_study(out, result, reading=leg.reading, how=how(*leg.stages(confirm), unequal),
                unit=leg.unit)  # fmt: skip
    return result
