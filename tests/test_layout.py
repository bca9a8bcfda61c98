"""The design card's layout: passes/ at the top level, installed as mase_lite.passes."""

import tomllib
from pathlib import Path

import mase_lite.passes

ROOT = Path(__file__).resolve().parents[1]


def _package_dirs() -> set[str]:
    found = set()
    for top, name in (("mase_lite", "mase_lite"), ("passes", "mase_lite.passes")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((name, *rel)))
    return found


def test_pyproject_lists_every_package_directory():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(config["packages"]) == _package_dirs()
    assert config["package-dir"] == {"mase_lite.passes": "passes"}


def test_passes_are_imported_from_the_top_level_directory():
    assert Path(mase_lite.passes.__file__).resolve() == ROOT / "passes" / "__init__.py"
    assert not (ROOT / "mase_lite" / "passes").exists()
