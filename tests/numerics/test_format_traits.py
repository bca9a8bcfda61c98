"""A format is one module: nothing outside it branches on its name (the quantize pass, checkpoints, calibration,
export targets and kernels look its traits up in the registry)."""

import ast
import sys
from pathlib import Path

from mase_lite.numerics import format_names, get_format

ROOT = Path(__file__).resolve().parents[2]


def _name_constants(node: ast.AST) -> list[str]:
    """The format names a comparison operand spells out: a string, or a tuple, list or set of strings."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    names = set(format_names())
    return [item.value for item in items if isinstance(item, ast.Constant) and item.value in names]


def _branches(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += [(node.lineno, name) for name in _name_constants(operand)]
    return found


def test_no_source_file_branches_on_a_format_name_but_the_format_own_module():
    owners = {name: Path(sys.modules[get_format(name).quantize.__module__].__file__).resolve() for name in format_names()}
    offences = []
    for path in sorted([*(ROOT / "mase_lite").rglob("*.py"), *(ROOT / "passes").rglob("*.py")]):
        for line, name in _branches(path.resolve()):
            if owners[name] != path.resolve():
                offences.append(f"{path.relative_to(ROOT)}:{line} compares with {name!r}")
    assert offences == []


def test_the_walk_finds_a_branch_on_a_name(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f(fmt):\n    return fmt["name"] == "mxint" or fmt["name"] in ("nvfp4", "other")\n')
    assert _branches(probe) == [(2, "mxint"), (2, "nvfp4")]
