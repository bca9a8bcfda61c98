"""The layering the design asks for, read from every import statement (function-level ones included)."""

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]

# module prefix -> the layers it must never import
ABOVE_INFRA = ("numerics", "kernels", "layers", "algorithms", "runtime", "ir", "viz", "codegen", "workloads", "deploy",
               "importers", "passes", "pipeline", "search", "bench", "checkpoint", "cli", "data", "reference")
FORBIDDEN = {
    "mase_lite.infra": tuple(f"mase_lite.{name}" for name in ABOVE_INFRA),
    "mase_lite.numerics": ("mase_lite.ir", "mase_lite.kernels", "mase_lite.layers", "mase_lite.algorithms", "mase_lite.runtime",
                           "mase_lite.passes", "mase_lite.pipeline", "mase_lite.search", "mase_lite.workloads"),
    "mase_lite.kernels": ("mase_lite.ir", "mase_lite.layers", "mase_lite.runtime", "mase_lite.passes", "mase_lite.pipeline",
                          "mase_lite.search", "mase_lite.codegen"),
    "mase_lite.layers": ("mase_lite.ir", "mase_lite.algorithms", "mase_lite.runtime", "mase_lite.workloads", "mase_lite.passes",
                         "mase_lite.pipeline", "mase_lite.search"),
    "mase_lite.algorithms": ("mase_lite.ir", "mase_lite.runtime", "mase_lite.workloads", "mase_lite.passes",
                             "mase_lite.pipeline", "mase_lite.search"),
    "mase_lite.runtime": ("mase_lite.ir", "mase_lite.algorithms", "mase_lite.workloads", "mase_lite.passes",
                          "mase_lite.pipeline", "mase_lite.search"),
    "mase_lite.ir": (
        "mase_lite.viz", "mase_lite.layers", "mase_lite.algorithms", "mase_lite.runtime", "mase_lite.infra.trust",
        "mase_lite.checkpoint", "mase_lite.passes", "mase_lite.pipeline", "mase_lite.search", "mase_lite.workloads",
        "mase_lite.codegen", "mase_lite.bench",
    ),
    "mase_lite.viz": (
        "mase_lite.layers", "mase_lite.infra.trust", "mase_lite.passes", "mase_lite.pipeline", "mase_lite.search",
        "mase_lite.workloads", "mase_lite.codegen", "mase_lite.bench",
    ),
    "mase_lite.workloads": ("mase_lite.passes", "mase_lite.pipeline", "mase_lite.search"),
    "mase_lite.codegen": ("mase_lite.pipeline", "mase_lite.search"),
    # exports sit below imports: an importer reads with the export's own facts (GGUF's container, target rules)
    "mase_lite.deploy": ("mase_lite.importers", "mase_lite.passes", "mase_lite.pipeline", "mase_lite.search", "mase_lite.bench"),
    "mase_lite.importers": ("mase_lite.passes", "mase_lite.pipeline", "mase_lite.search", "mase_lite.bench"),
    "mase_lite.passes": ("mase_lite.pipeline", "mase_lite.search", "mase_lite.bench"),
    "mase_lite.pipeline": ("mase_lite.search", "mase_lite.bench"),
}


# The public API's conveniences on MaseGraph (module, method, what it imports when called): the IR uses none of it.
FACADES = {
    ("mase_lite.ir.graph", "draw", "mase_lite.viz.draw"),
    ("mase_lite.ir.graph", "to_networkx", "mase_lite.viz.nx"),
    ("mase_lite.ir.graph", "load", "mase_lite.checkpoint"),
    ("mase_lite.ir.graph", "save", "mase_lite.checkpoint"),
    ("mase_lite.ir.module_model", "save", "mase_lite.checkpoint"),
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
    """The mase_lite modules (and names) ``name`` imports, but the facade imports of :data:`FACADES`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    scope = {id(inner): fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) for inner in ast.walk(fn)}
    out = set()
    for node in ast.walk(tree):
        found = set()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        facade = {m for m in found if (name, scope.get(id(node)), m.rpartition(".")[0]) in FACADES or (name, scope.get(id(node)), m) in FACADES}
        out.update(found - facade)
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


def test_the_facades_exist_and_import_only_what_they_name():
    for module, function, imported in FACADES:
        tree = ast.parse(MODULES[module].read_text())
        (fn,) = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == function]
        assert imported in [n.module for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)]


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


def _module_level_imports(name: str, path: Path) -> set[str]:
    """The mase_lite modules ``name`` imports when it is imported (statements at module level): ``from x import y``
    imports ``x`` (a package's ``__init__`` included) and ``x.y`` where that is a module; ``import x.y as z``
    imports ``x.y``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return {m for m in out if m in MODULES and m != name}


def test_no_package_has_a_module_level_import_cycle():
    """Importing any module never comes back to one being imported (a package's __init__ included): no module
    runs half-initialised."""
    graph = nx.DiGraph()
    for name, path in MODULES.items():
        graph.add_node(name)
        graph.add_edges_from((name, m) for m in _module_level_imports(name, path))
    assert sorted(sorted(c) for c in nx.simple_cycles(graph)) == []


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_two_packages_import_each_other():
    """Between mase_lite's packages (and top-level modules) the imports, function-level ones included, form no circle."""
    graph = nx.DiGraph()
    for name, imported_set in IMPORTS.items():
        for imported in imported_set:
            a, b = _package(name), _package(imported)
            if a != b and b in {_package(m) for m in MODULES} and b != "mase_lite":
                graph.add_edge(a, b)
    assert sorted(sorted(c) for c in nx.simple_cycles(graph)) == []
