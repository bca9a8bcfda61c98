"""The runtime dependencies in pyproject.toml are exactly the distributions the package imports."""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWN = {"mase_lite", "passes"}


def imported_distributions() -> tuple[set[str], set[str]]:
    """(distributions imported at module level, those imported only inside functions), normalised names."""
    to_dist = importlib.metadata.packages_distributions()
    top, inner = set(), set()
    for package in OWN:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    module = name.split(".")[0]
                    if module in sys.stdlib_module_names or module in OWN:
                        continue
                    if module not in to_dist:  # an optional extra imported on demand (cmaes for Optuna's CMA-ES)
                        assert node.col_offset > 0, f"{path}: {module} is imported at module level but not installed"
                        continue
                    (top if node.col_offset == 0 else inner).update(normalise(d) for d in to_dist[module])
    return top, inner - top


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> tuple[set[str], set[str]]:
    """(runtime dependencies, optional extras) of pyproject.toml, normalised names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = lambda reqs: {normalise(re.match(r"[A-Za-z0-9_.-]+", r).group()) for r in reqs}  # noqa: E731
    return names(project["dependencies"]), {n for extra in project["optional-dependencies"].values() for n in names(extra)}


def test_runtime_dependencies_are_what_the_package_imports():
    top, inner = imported_distributions()
    runtime, _ = declared()
    assert top - runtime == set(), "imported at module level but not declared"
    assert runtime - top - inner == set(), "declared but never imported"
