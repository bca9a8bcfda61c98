"""The docstring examples written as doctests (``>>>``) run, each module imported by its installed name.

The pass modules live in the top-level ``passes/`` but are imported as ``mase_lite.passes.…``: pytest's
``--doctest-modules`` would import them a second time under another name, and register every pass twice.
So the modules are found here from the installed packages' directories and imported by their real names.
Examples that need a trained model or files stay as ``Example::`` prose.
"""

import doctest
import importlib
import importlib.util
from pathlib import Path

import pytest

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _package_roots() -> list[tuple[Path, str]]:
    """``(directory, module name)`` of ``mase_lite`` and of ``mase_lite.passes``, which lives elsewhere."""
    return [(Path(importlib.util.find_spec(name).origin).parent, name) for name in ("mase_lite", "mase_lite.passes")]


def modules_with_doctests() -> list[str]:
    """The installed names of the modules whose source has a ``>>>`` prompt, sorted."""
    names = set()
    for root, package in _package_roots():
        for path in root.rglob("*.py"):
            if ">>>" not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(root).with_suffix("").parts
            names.add(".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return sorted(names)


@pytest.mark.parametrize("name", modules_with_doctests())
def test_docstring_examples_run(name, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # an example that writes a relative path writes it here
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    assert tests, f"{name} has a '>>>' prompt outside any docstring doctest finds"
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_pass_modules_are_found_under_their_installed_names():
    assert "mase_lite.passes.registry" in modules_with_doctests()
    assert not any(name.startswith("passes.") for name in modules_with_doctests())
