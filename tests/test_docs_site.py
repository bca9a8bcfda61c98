"""The docs site: its generated reference is current, and it builds with ``mkdocs build --strict``, which fails on a
broken link.

The reference is generated in a fresh process: tests register passes, formats and targets of their own in this one.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "NO_MKDOCS_2_WARNING": "1"}


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[dev]')")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)]
    return subprocess.run(command, cwd=root, env=ENV, capture_output=True, text=True, timeout=120)


def _pages(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in directory.glob("*.md")}


def test_the_committed_reference_is_what_the_code_generates(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mase_lite.reference", str(tmp_path)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _pages(ROOT / "docs" / "reference") == _pages(tmp_path), \
        "docs/reference is stale: run python -m mase_lite.reference docs/reference"


def test_the_site_builds_strictly(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "reference" / "passes" / "index.html").is_file()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    with (tmp_path / "docs" / "index.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [the missing page](reference/no-such-page.md).\n")
    done = _build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "reference/no-such-page.md" in done.stdout + done.stderr
