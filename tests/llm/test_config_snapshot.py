"""Every committed config file (``configs/**/*.toml``) loads to the same dataclasses as recorded
in ``tests/llm/data/config_snapshot.json.gz``: train configs (`llm.config.load_config`, and the
resolved TOML `llm.config.config_to_toml` writes into a run folder), LLM and toy sweeps and
studies, and each ``--describe`` text. The snapshot was taken with the loader before its rewrite
(issue 58); ``python tests/llm/test_config_snapshot.py`` writes it again from the present code."""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
from pathlib import Path

import pytest

from llm import config
from llm.orchestrate import study_spec as llm_study
from llm.orchestrate import sweep_spec as llm_sweep
from llm.tasks import TASKS
from shaping import methods as shaping_methods
from toymdp import study_spec as toy_study
from toymdp import sweep_spec as toy_sweep

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).with_name("data") / "config_snapshot.json.gz"
FILES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.toml"))


def _plain(obj: object) -> object:
    """`obj` (dataclasses, tuples, dicts) as JSON values, the repository's path made relative."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    text = json.dumps(obj, sort_keys=True, default=repr)
    return json.loads(text.replace(str(ROOT), "<repo>"))


def load(rel: str) -> object:
    """What the config file `rel` (relative to the repository) loads to, as JSON values."""
    path = ROOT / rel
    name = path.name
    if rel.startswith("configs/toy/"):
        if name.startswith("study_"):
            return [_plain(x) for x in toy_study.load_study(path)]
        return _plain(toy_sweep.load_config(path))
    if name.startswith("study_"):
        return [_plain(x) for x in llm_study.load_study(path)]
    if name.startswith("sweep_"):
        return _plain(llm_sweep.load_sweep(path))
    cfg = config.load_config(path)
    return {"config": _plain(cfg), "toml": config.config_to_toml(cfg)}


def describes() -> dict[str, str]:
    """The ``--describe`` texts of a train config, an LLM sweep and a toy sweep."""
    return {"train": config.describe(), "llm_sweep": llm_sweep.describe(),
            "toy_sweep": toy_sweep.describe()}  # fmt: skip


def snapshot() -> dict[str, object]:
    """Every config file's loaded value and the describe texts."""
    return {"files": {rel: load(rel) for rel in FILES}, "describe": describes()}


@pytest.fixture(scope="module")
def recorded() -> dict[str, object]:
    return json.loads(gzip.decompress(SNAPSHOT.read_bytes()))


def test_every_config_file_is_recorded(recorded):
    assert sorted(recorded["files"]) == FILES


@pytest.mark.parametrize("rel", FILES)
def test_config_file_loads_as_recorded(rel, recorded):
    assert load(rel) == recorded["files"][rel]


@pytest.fixture
def package_methods():
    """The method and task registries with the package's own entries alone for the test
    (`describe` lists every registered method's defaults and every task; another test module of
    this worker may have registered its own: `tests/llm/parity_task.py` registers a task when
    imported), restored after it."""
    methods, tasks = dict(shaping_methods._REGISTRY), dict(TASKS._tasks)
    for name, m in methods.items():
        if getattr(m.function, "__module__", None) != "shaping.methods":
            del shaping_methods._REGISTRY[name]
    for name, t in tasks.items():
        if not getattr(t.prompt, "__module__", "").startswith("llm.tasks."):
            del TASKS._tasks[name]
    yield
    shaping_methods._REGISTRY.clear()
    shaping_methods._REGISTRY.update(methods)
    TASKS._tasks.clear()
    TASKS._tasks.update(tasks)


@pytest.mark.usefixtures("package_methods")
def test_describe_texts_as_recorded(recorded):
    assert describes() == recorded["describe"]


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(exist_ok=True)
    text = json.dumps(snapshot(), indent=1, sort_keys=True) + "\n"
    SNAPSHOT.write_bytes(gzip.compress(text.encode(), mtime=0))
    sys.exit(0)
