"""The ``report`` pass: a table of nodes to the console, and as Markdown and JSON files."""

from __future__ import annotations

import json

from pydantic import Field
from tqdm import tqdm

from mase_lite.infra.errors import ensure_dir
from mase_lite.passes.registry import PassParams, PassResult, register_pass

COLUMNS = ("name", "op", "module", "inputs", "output", "format")


class ReportParams(PassParams):
    path: str = Field("graph_report", description="file stem: writes <path>.md and <path>.json, relative to the run")
    all_nodes: bool = Field(False, description="include function nodes, not only modules, inputs and outputs")
    console: bool = Field(True, description="print the table")


def _shape(entry) -> str:
    if not entry:
        return "-"
    return "×".join(str(d) for d in entry["shape"]) or "scalar"


def _format(fmt) -> str:
    if isinstance(fmt, dict):
        rest = ",".join(f"{k}={v}" for k, v in fmt.items() if k != "name")
        return f"{fmt.get('name')}({rest})"
    return str(fmt)


def node_row(node) -> dict[str, str]:
    meta = node.meta["mase"]
    weight = meta["params"].get("weight")
    out = meta["results"][0] if meta["results"] else None
    fmt = weight["format"] if weight else (out["format"] if out else "-")
    return {
        "name": node.name,
        "op": meta["op"],
        "module": meta.get("module") or meta.get("target") or "",
        "inputs": ", ".join(_shape(a) for a in meta["args"] if a) or "-",
        "output": _shape(out),
        "format": _format(fmt),
    }


def markdown_table(rows: list[dict[str, str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r[c] for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def console_table(rows: list[dict[str, str]]) -> str:
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) if rows else len(c) for c in COLUMNS}
    line = "  ".join(c.ljust(widths[c]) for c in COLUMNS)
    body = ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join([line, "-" * len(line), *body])


@register_pass("report", kind="analysis", params=ReportParams)
def report_pass(mg, params: ReportParams, ctx):
    """Tabulate nodes (name, op, module class, shapes, format); write <path>.md and <path>.json.

    Example: ``ml.passes.report(mg, {"path": "bert_nodes"})``.
    """
    shown = ("call_module", "placeholder", "output") if not params.all_nodes else None
    rows = [node_row(n) for n in mg.model.graph.nodes if shown is None or n.op in shown]
    stem = ctx.path(params.path)
    ensure_dir(stem.parent, "path")
    md, js = stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".json")
    md.write_text(markdown_table(rows))
    js.write_text(json.dumps(rows, indent=2))
    if params.console:
        tqdm.write(console_table(rows))
    return PassResult({"rows": len(rows), "markdown": str(md), "json": str(js)})
