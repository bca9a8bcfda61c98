"""Draw a MaseGraph with graphviz: one box per node with its op and output shape.

Shape-symbol nodes (``sym_size``), assertions and parameter reads are left out: they add
no information and can fan out to dozens of edges. ``dot`` runs with a timeout.

Example::

    mg.draw("bert.svg")        # .svg, .png or .pdf; .dot writes the graphviz source only
"""

from __future__ import annotations

import html
import shutil
import subprocess
from pathlib import Path

import torch.fx as fx

from mase_lite.errors import UserError, ensure_dir
from mase_lite.files import staged_file

FORMATS = ("svg", "png", "pdf", "dot")
_HIDDEN_OPS = {"sym_size", "assert"}
_FILL = {"module": "#dbe9f6", "function": "#f3f3f3", "placeholder": "#d9f2d9", "output": "#f9e0c7"}


def _hidden(node: fx.Node) -> bool:
    meta = node.meta.get("mase", {})
    return node.op == "get_attr" or meta.get("op") in _HIDDEN_OPS


def _label(node: fx.Node) -> str:
    meta = node.meta.get("mase", {})
    title = f"<b>{html.escape(node.name)}</b>"
    op = meta.get("op", node.op)
    kind = meta.get("module") or (meta.get("target") if op == "unknown" else None)
    rows = [title, html.escape(f"{op} ({kind})" if kind else op)]
    for r in meta.get("results", [])[:2]:
        if r:
            shape = "×".join(str(d) for d in r["shape"]) or "scalar"
            fmt = r["format"] if isinstance(r["format"], str) else r["format"].get("name", "?")
            rows.append(html.escape(f"{shape} {fmt}"))
    return "<" + "<br/>".join(rows) + ">"


def to_dot(mg) -> str:
    """The graphviz source of ``mg``'s graph."""
    lines = [
        "digraph mase {",
        '  graph [rankdir=TB, fontname="Helvetica"];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
    ]
    shown = [n for n in mg.model.graph.nodes if not _hidden(n)]
    ids = {n: f"n{i}" for i, n in enumerate(shown)}
    for n in shown:
        fill = _FILL.get(n.meta.get("mase", {}).get("type", ""), "#ffffff")
        lines.append(f'  {ids[n]} [label={_label(n)}, fillcolor="{fill}"];')
    for n in shown:
        for a in n.all_input_nodes:
            if a in ids:
                lines.append(f"  {ids[a]} -> {ids[n]};")
    lines.append("}")
    return "\n".join(lines)


def draw(mg, path: str | Path, timeout: float = 60.0) -> Path:
    """Render ``mg`` to ``path``; the format comes from the extension."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise UserError(f"draw: cannot tell the format of {path.name!r}; use one of: {', '.join(FORMATS)}")
    source = to_dot(mg)
    ensure_dir(path.parent, "draw.path")
    if fmt == "dot":
        path.write_text(source)
        return path
    dot = shutil.which("dot")
    if dot is None:
        raise UserError(
            "draw: graphviz's `dot` program is not installed (Debian/Ubuntu: apt-get install graphviz; "
            "macOS: brew install graphviz); write a .dot file instead to skip rendering"
        )
    try:
        with staged_file(path) as tmp:
            subprocess.run(
                [dot, f"-T{fmt}", "-o", str(tmp)], input=source.encode(), check=True, timeout=timeout, capture_output=True
            )
    except subprocess.TimeoutExpired:
        raise UserError(f"draw: dot took longer than {timeout:.0f} s on {len(mg.nodes)} nodes") from None
    except subprocess.CalledProcessError as err:
        raise UserError(f"draw: dot failed: {err.stderr.decode(errors='replace').strip()}") from None
    return path
