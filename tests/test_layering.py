"""The layering the design asks for, read from every import statement (function-level ones included)."""

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]

# module prefix -> the layers it must never import
FORBIDDEN = {
    "mase_lite.numerics": ("mase_lite.ir", "mase_lite.nn", "mase_lite.passes", "mase_lite.pipeline", "mase_lite.search"),
    "mase_lite.kernels": ("mase_lite.ir", "mase_lite.passes", "mase_lite.pipeline", "mase_lite.search", "mase_lite.codegen"),
    "mase_lite.nn": ("mase_lite.ir", "mase_lite.passes", "mase_lite.pipeline", "mase_lite.search"),
    "mase_lite.ir": ("mase_lite.passes", "mase_lite.pipeline", "mase_lite.search", "mase_lite.train", "mase_lite.codegen", "mase_lite.bench"),
    "mase_lite.train": ("mase_lite.passes", "mase_lite.pipeline", "mase_lite.search"),
    "mase_lite.codegen": ("mase_lite.pipeline", "mase_lite.search"),
    "mase_lite.passes": ("mase_lite.pipeline", "mase_lite.search", "mase_lite.bench"),
    "mase_lite.pipeline": ("mase_lite.search", "mase_lite.bench"),
}


def _modules() -> dict[str, Path]:
    found = {}
    for top, package in (("mase_lite", "mase_lite"), ("passes", "mase_lite.passes")):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT / top).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _imports(name: str, path: Path) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in out if m.startswith("mase_lite")}


MODULES = _modules()
IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_a_layer_above_it(layer):
    bad = sorted(
        f"{name} imports {imported}"
        for name, imported_set in IMPORTS.items()
        if name == layer or name.startswith(layer + ".")
        for imported in imported_set
        if any(imported == f or imported.startswith(f + ".") for f in FORBIDDEN[layer])
    )
    assert bad == []


def test_the_ir_has_no_import_cycle():
    graph = nx.DiGraph()
    ir = {n for n in MODULES if n.startswith("mase_lite.ir.")}
    for name in ir:
        graph.add_node(name)
        graph.add_edges_from((name, m) for m in IMPORTS[name] if m in ir)
    assert list(nx.simple_cycles(graph)) == []


def test_only_the_search_internals_touch_optunas_private_api():
    private = re.compile(r"\boptuna(?:\.\w+)*\._\w|\._(?:storage|trial_id|study_id|all_grids|get_stale_trial_ids|lock|file_path)\b")
    touching = sorted(name for name, path in MODULES.items() if private.search(path.read_text()))
    assert touching == ["mase_lite.search.internals"]
