"""`make docs` (tools/api_reference.py): pdoc's reference of a package, its submodules hidden by
``__all__`` included, private modules and ``__main__`` left out, a module needing a missing
optional dependency left out by name, any other import failure named; no warning for `shaping`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("pdoc")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def api():
    spec = importlib.util.spec_from_file_location("api_reference", ROOT / "tools/api_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shaping_reference(api, tmp_path, capsys):
    out = tmp_path / "api"
    assert api.main(["--out", str(out), "--strict", "shaping"]) == 0
    # shaping's __all__ names no submodule: pdoc's own walk would document the package alone
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html"))
    assert {"shaping.html", "shaping/core.html", "shaping/methods.html"} <= set(pages)
    core = (out / "shaping/core.html").read_text(encoding="utf-8")
    assert '<span class="name">agg_loss</span>' in core  # a public function, with its sections
    assert 'id="agg_loss"' in core and "Raises" in core
    assert "warning" not in capsys.readouterr().err


def _package(root: Path, files: dict[str, str]) -> str:
    pkg = root / "pdocprobe"
    pkg.mkdir()
    for name, text in {"__init__.py": '"""Probe."""\n__all__ = []\n', **files}.items():
        (pkg / name).write_text(text, encoding="utf-8")
    return "pdocprobe"


@pytest.fixture
def probe_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    (tmp_path / "src").mkdir()
    yield tmp_path / "src"
    for name in [m for m in sys.modules if m.split(".")[0] == "pdocprobe"]:
        del sys.modules[name]


def test_optional_dependency_left_out(api, probe_path, tmp_path, capsys):
    assert importlib.util.find_spec("vllm") is None, "the probe needs vLLM absent"
    name = _package(probe_path, {
        "kept.py": '"""Kept."""\n\ndef probe_function():\n    """Documented."""\n',
        "gpu.py": '"""Needs vLLM."""\nimport vllm\n',
        "_private.py": '"""Private."""\n',
        "__main__.py": 'raise SystemExit("__main__ must not be imported")\n',
    })  # fmt: skip
    out = tmp_path / "api"
    assert api.build(out, [name]) == []
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html"))
    assert pages == ["index.html", "pdocprobe.html", "pdocprobe/kept.html"]
    assert "probe_function" in (out / "pdocprobe/kept.html").read_text(encoding="utf-8")
    assert "pdocprobe.gpu left out" in capsys.readouterr().err
    assert not list(tmp_path.glob(".api-*"))  # the temporary folder is gone


def test_other_import_failure_named(api, probe_path, tmp_path):
    name = _package(probe_path, {"broken.py": "import a_module_nobody_has_1f3c\n"})
    out = tmp_path / "api"
    out.mkdir()
    (out / "index.html").write_text("old", encoding="utf-8")
    with pytest.raises(ImportError, match=r"^pdocprobe\.broken: .*a_module_nobody_has_1f3c"):
        api.build(out, [name])
    assert (out / "index.html").read_text(encoding="utf-8") == "old"  # nothing half written


def test_unknown_package_refused(api, capsys):
    with pytest.raises(SystemExit):
        api.main(["nosuchpackage"])
    assert "packages: 'nosuchpackage' is not one of" in capsys.readouterr().err
