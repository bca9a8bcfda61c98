"""Draw a MaseGraph with the ``graphviz`` package: nested module clusters, collapsed depth,
folded repeats, colours by op type, number format, sparsity or a profile statistic.

Every box and cluster has a tooltip with its metadata (SVG viewers show it on hover).
Shape-symbol nodes (``sym_size``), assertions and parameter reads are left out: they add no
information and can fan out to dozens of edges. ``dot`` runs with a timeout. A ``.graphml``
or ``.json`` path writes the networkx graph (:mod:`mase_lite.viz.nx`) instead of a picture.

Example::

    >>> import torch, mase_lite as ml
    >>> net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(3)])
    >>> mg = ml.MaseGraph(net, example_inputs={"input": torch.randn(2, 8)})
    >>> d = build(mg, DrawOptions(depth=1, fold_repeats=True))
    >>> d.boxes, d.folded
    (3, {'0': 3})
    >>> print(d.labels[d.node_ids["2_0"]])
    0–2 ×3 (Sequential)
    in: batch×8 / out: batch×8
    params: 72

``mg.draw("bert.svg", depth=3, fold_repeats=True, color_by="format")`` takes the same options.
"""

from __future__ import annotations

import html
import json
import logging
import shutil
import subprocess
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import graphviz
import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mase_lite.infra.errors import UserError, ensure_dir, format_validation_error
from mase_lite.infra.files import staged_file
from mase_lite.viz.nx import to_networkx, write_graph

logger = logging.getLogger(__name__)

PICTURES = ("svg", "png", "pdf")
FORMATS = (*PICTURES, "dot", "graphml", "json")
ColorBy = Literal[
    "type", "format", "sparsity",
    "data_out.min", "data_out.max", "data_out.mean", "data_out.variance", "data_out.abs_mean",
    "weight.min", "weight.max", "weight.mean", "weight.variance", "weight.abs_mean",
]  # fmt: skip
_HIDDEN_OPS = {"sym_size", "assert"}
_TYPE_FILL = {"module": "#dbe9f6", "function": "#f3f3f3", "placeholder": "#d9f2d9", "output": "#f9e0c7"}
_BOX_FILL = "#fff2cc"
_PALETTE = ("#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#ffffb3", "#bc80bd", "#ccebc5")
_PLAIN = "#ffffff"


class DrawOptions(BaseModel):
    """What to draw and how; ``mg.draw`` and the ``draw`` pass take these fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(
        "graph.svg", description="output file: .svg, .png, .pdf, .dot (graphviz source), .graphml or .json (networkx graph)"
    )
    depth: int | None = Field(
        None, ge=1, description="modules this deep (1: the model's children) are drawn as one box each; null: every node"
    )
    fold_repeats: bool = Field(False, description="draw a run of structurally identical sibling blocks once, labelled ×N")
    color_by: ColorBy = Field("type", description="fill colour by op type, number format, sparsity or a profile statistic")
    timeout: float = Field(60.0, gt=0, description="seconds dot may take")


def options(path: str | Path, **given: Any) -> DrawOptions:
    """Validated options; a bad value is a ``UserError`` naming the field and the allowed values."""
    try:
        return DrawOptions.model_validate({"path": str(path), **given})
    except ValidationError as err:
        raise UserError(format_validation_error(err, prefix="draw", model=DrawOptions)) from None


@dataclass
class Drawing:
    """A built drawing: the graphviz graph plus what it shows."""

    graph: graphviz.Digraph
    boxes: int
    labels: dict[str, str]  # drawn id (node or cluster) -> label text
    node_ids: dict[str, str]  # fx node name -> the drawn id it is shown in
    folded: dict[str, int] = field(default_factory=dict)
    note: str | None = None


def _hidden(attrs: dict[str, Any]) -> bool:
    return attrs["node_op"] == "get_attr" or attrs["op"] in _HIDDEN_OPS


def _shape(shape: list) -> str:
    return "×".join(str(d) for d in shape) or "scalar"


def describe_format(fmt: Any) -> str:
    """``integer(width=8, frac_width=4)`` for a format dict; a dtype name as it is."""
    if isinstance(fmt, str):
        return fmt
    widths = [f"{k}={v}" for k, v in fmt.items() if v is not None and ("width" in k or "size" in k or "bias" in k)]
    return f"{fmt.get('name')}({', '.join(widths)})"


def _format_name(fmt: Any) -> str:
    return fmt if isinstance(fmt, str) else str(fmt.get("name"))


def _format_key(attrs: dict[str, Any]) -> str | None:
    """The format a node is coloured by: its weight's, else its input's, else any operand's."""
    formats = attrs.get("format")
    if not formats:
        return None
    return _format_name(formats.get("weight") or formats.get("data_in") or next(iter(formats.values())))


def _stat(attrs: dict[str, Any], color_by: str) -> float | None:
    operand, stat = color_by.split(".")
    value = (attrs.get("profile") or {}).get(operand, {}).get(stat)
    return float(value) if isinstance(value, (int, float)) else None


def _tooltip(name: str, attrs: dict[str, Any]) -> str:
    lines = [name, f"op: {attrs['op']}" + (f" ({attrs['module_type']})" if attrs["node_op"] == "call_module" else "")]
    if attrs["module_path"]:
        lines.append(f"module: {attrs['module_path']} ({attrs['module_type']})")
    for i, r in enumerate(attrs["results"]):
        lines.append(f"out {i}: {_shape(r['shape'])} {r['dtype']} {describe_format(r['format'])}")
    for operand, fmt in (attrs.get("format") or {}).items():
        lines.append(f"{operand}: {describe_format(fmt)}")
    if attrs["param_count"]:
        lines.append(f"params: {attrs['param_count']:,}")
    if "sparsity" in attrs:
        lines.append(f"sparsity: {attrs['sparsity']:.3f}")
    for operand, stats in (attrs.get("profile") or {}).items():
        shown = {k: round(v, 6) for k, v in stats.items() if isinstance(v, float)}
        lines.append(f"profile {operand}: {json.dumps(shown)}")
    return "\n".join(lines)


def _escape_tooltip(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _params(n: int) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


class _Layout:
    """Which box each fx node is drawn in, and which cluster each box sits in."""

    def __init__(self, g: nx.DiGraph, opts: DrawOptions):
        self.g = g
        self.opts = opts
        self.shown = [n for n, a in g.nodes(data=True) if not _hidden(a)]
        self.order = {n: i for i, n in enumerate(self.shown)}
        self.module_type: dict[str, str] = {}
        self.inside: dict[str, list[str]] = defaultdict(list)  # module path -> shown nodes in it
        for n in self.shown:
            for path, cls in g.nodes[n]["scope"]:
                self.module_type[path] = cls
                self.inside[path].append(n)
        self.rep: dict[str, str] = {}  # folded member node -> its representative's node
        self.folded: dict[str, list[str]] = {}  # representative module path -> member paths
        self.member: dict[str, str] = {}  # node -> the folded module it lies in
        if opts.fold_repeats:
            self._fold()
        self.constant: dict[str, str] = {}  # node -> first node of its group of constant-only ops
        if opts.depth is not None:
            self._group_constants()

    def scope(self, node: str) -> list[str]:
        return [p for p, _ in self.g.nodes[node]["scope"]]

    def unit(self, node: str) -> tuple[str, str]:
        """``("node", name)`` or ``("box", module path)`` that ``node`` is drawn as."""
        node = self.rep.get(node, node)
        if node in self.constant:
            return ("const", self.constant[node])
        s = self.scope(node)
        depth = self.opts.depth
        if depth is not None and len(s) >= depth:
            return ("box", s[depth - 1])
        return ("node", node)

    def clusters(self, unit: tuple[str, str]) -> list[str]:
        kind, key = unit
        if kind == "box":
            s = self.scope(self.inside[key][0])
            return s[: s.index(key)]
        if kind == "const":
            scopes = [self.scope(n) for n, first in self.constant.items() if first == key]
            common = scopes[0][: next((i for i, p in enumerate(zip(*scopes)) if len(set(p)) > 1), min(map(len, scopes)))]
            return common[: self.opts.depth - 1] if self.opts.depth else common
        return self.scope(key)

    def _group_constants(self) -> None:
        """Function nodes computed from constants and shapes alone (masks, position ids), one group per
        connected set."""
        const: set[str] = set()
        for n in self.shown:
            a = self.g.nodes[n]
            if (
                a["node_op"] in ("call_function", "call_method")
                and n not in self.rep
                and len(a["scope"]) < self.opts.depth
                and all(p in const or _hidden(self.g.nodes[p]) for p in self.g.predecessors(n))
            ):
                const.add(n)
        for group in nx.weakly_connected_components(self.g.subgraph(const)):
            first = min(group, key=self.order.__getitem__)
            self.constant.update((n, first) for n in group)

    def colour_key(self, node: str) -> Any:
        a, by = self.g.nodes[node], self.opts.color_by
        if by == "format":
            return _format_key(a)
        if by == "sparsity":
            return a.get("sparsity")
        if by == "type":
            return None
        return _stat(a, by)

    def _hash(self, path: str) -> str:
        members = self.inside[path]
        sub = nx.DiGraph()
        for n in members:
            a = self.g.nodes[n]
            sub.add_node(n, label=f"{a['op']}|{a['module_type'] if a['node_op'] == 'call_module' else ''}|{self.colour_key(n)}")
        sub.add_edges_from(e for e in self.g.subgraph(members).edges())
        with warnings.catch_warnings():  # networkx notes that directed hashes changed in 3.5
            warnings.simplefilter("ignore", UserWarning)
            return nx.weisfeiler_lehman_graph_hash(sub, node_attr="label", iterations=3)

    def _fold(self) -> None:
        """Fold runs of sibling modules with one class, equal subgraph hashes, each feeding the next."""
        depth = self.opts.depth
        candidates: dict[tuple[int, str, str], list[str]] = defaultdict(list)
        for path in self.inside:
            s = self.scope(self.inside[path][0])
            level = s.index(path)
            if depth is not None and level >= depth:
                continue
            candidates[(level, s[level - 1] if level else "", self.module_type[path])].append(path)
        done: set[str] = set()
        for (level, parent, _), paths in sorted(candidates.items()):
            enclosing = self.scope(self.inside[paths[0]][0])[:level]
            if len(paths) < 2 or any(p in done for p in enclosing):
                continue
            paths.sort(key=lambda p: self.order[self.inside[p][0]])
            hashes = {p: self._hash(p) for p in paths}
            run = [paths[0]]
            for prev, cur in zip(paths, paths[1:] + [None]):
                if cur is not None and hashes[cur] == hashes[prev] and self._feeds(prev, cur):
                    run.append(cur)
                    continue
                if len(run) > 1:
                    self._fold_run(run)
                    done.update(run)
                run = [cur]

    def _feeds(self, a: str, b: str) -> bool:
        inner = set(self.inside[b])
        return any(v in inner for u in self.inside[a] for v in self.g.successors(u))

    def _fold_run(self, run: list[str]) -> None:
        first = self.inside[run[0]]
        if any(len(self.inside[p]) != len(first) for p in run):
            return
        for p in run[1:]:
            self.rep.update(zip(self.inside[p], first))
        self.member.update((n, p) for p in run for n in self.inside[p])
        self.folded[run[0]] = run


def build(mg, opts: DrawOptions | None = None) -> Drawing:
    """The graphviz drawing of ``mg`` (see :class:`DrawOptions`); nothing is rendered."""
    opts = opts or DrawOptions()
    g = to_networkx(mg)
    lay = _Layout(g, opts)
    colours, legend, note, palette = _colouring(g, lay, opts)

    units: dict[tuple[str, str], list[str]] = defaultdict(list)
    for n in lay.shown:
        units[lay.unit(n)].append(n)
    ids = {u: f"{'n' if u[0] == 'node' else u[0]}_{i}" for i, u in enumerate(units)}
    labels: dict[str, str] = {}

    tree: dict[tuple[str, ...], list[tuple[str, str]]] = defaultdict(list)
    for u in units:
        tree[tuple(lay.clusters(u))].append(u)

    dot = graphviz.Digraph(name="mase", graph_attr={"rankdir": "TB", "fontname": "Helvetica", "tooltip": g.graph["name"]})
    dot.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="10")
    dot.attr("edge", arrowsize="0.6")

    def emit_units(sub: graphviz.Digraph, prefix: tuple[str, ...]) -> None:
        for u in tree.get(prefix, []):
            kind, key = u
            if kind == "node":
                a = g.nodes[key]
                text, html_label = _node_label(key, a, opts)
                tooltip = _tooltip(key, a)
                fill = colours.get(u, _PLAIN if legend else _TYPE_FILL.get(a["node_op"].replace("call_", ""), _PLAIN))
            elif kind == "const":
                text, html_label, tooltip = _constants_label(units[u], g)
                fill = colours.get(u, _PLAIN if legend else _TYPE_FILL["function"])
            else:
                text, html_label, tooltip = _box_label(key, g, lay, mg, palette)
                fill = colours.get(u, _PLAIN if legend else _BOX_FILL)
            labels[ids[u]] = text
            sub.node(ids[u], label=html_label, fillcolor=fill, tooltip=_escape_tooltip(tooltip),
                     **({"penwidth": "2"} if kind == "box" else {}))

    def emit_cluster(parent: graphviz.Digraph, prefix: tuple[str, ...]) -> None:
        emit_units(parent, prefix)
        children = sorted({k[len(prefix)] for k in tree if len(k) > len(prefix) and k[: len(prefix)] == prefix},
                          key=lambda p: lay.order[lay.inside[p][0]])
        for path in children:
            child = (*prefix, path)
            with parent.subgraph(name=f"cluster_{path}") as c:
                text, tip = _cluster_label(path, prefix[-1] if prefix else "", lay, mg)
                labels[f"cluster_{path}"] = text
                c.attr(label=text, tooltip=_escape_tooltip(tip), style="rounded,dashed", color="#7f7f7f",
                       fontname="Helvetica", fontsize="10", labeljust="l")
                emit_cluster(c, child)

    emit_cluster(dot, ())
    edges: dict[tuple[str, str], bool] = {}
    for v in lay.shown:
        for u in g.predecessors(v):
            if u in lay.order:
                a, b = ids[lay.unit(u)], ids[lay.unit(v)]
                # a box's inner edges are not drawn; one folded block feeding the next is a loop back
                loop = u in lay.member and v in lay.member and lay.member[u] != lay.member[v]
                if a != b or loop:
                    edges[(a, b)] = edges.get((a, b), False) or loop
    for (a, b), loop in sorted(edges.items()):
        dot.edge(a, b, **({"style": "dashed", "constraint": "false", "tooltip": "next repeat"} if loop else {}))
    if legend or note:
        dot.node("legend", label=_legend(legend, note), shape="plaintext", style="", tooltip="legend")
    folded = {p: len(run) for p, run in lay.folded.items()}
    node_ids = {n: ids[lay.unit(n)] for n in lay.shown}
    return Drawing(dot, boxes=len(units), labels=labels, node_ids=node_ids, folded=folded, note=note)


def _node_label(name: str, a: dict[str, Any], opts: DrawOptions) -> tuple[str, str]:
    kind = a["module_type"] if a["node_op"] == "call_module" else None
    rows = [name, f"{a['op']} ({kind})" if kind else a["op"]]
    rows += [f"{_shape(r['shape'])} {r['dtype']}" for r in a["results"][:2]]
    if opts.color_by == "format":
        rows += [f"{k}: {describe_format(f)}" for k, f in (a.get("format") or {}).items()]
    elif opts.color_by == "sparsity" and "sparsity" in a:
        rows.append(f"sparsity {a['sparsity']:.0%}")
    elif opts.color_by not in ("type", "format", "sparsity") and _stat(a, opts.color_by) is not None:
        rows.append(f"{opts.color_by} {_stat(a, opts.color_by):.4g}")
    html_rows = [f"<b>{html.escape(rows[0])}</b>"] + [html.escape(r) for r in rows[1:]]
    return "\n".join(rows), "<" + "<br/>".join(html_rows) + ">"


def _boundary(nodes: list[str], g: nx.DiGraph) -> tuple[list[str], list[str]]:
    """Shapes entering and leaving a set of nodes."""
    inner = set(nodes)
    ins, outs = [], []
    for n in nodes:
        for p in g.predecessors(n):
            if p not in inner and g.nodes[p]["op"] not in _HIDDEN_OPS and g.nodes[p]["results"]:
                ins.append(_shape(g.nodes[p]["results"][0]["shape"]))
        if any(s not in inner for s in g.successors(n)) and g.nodes[n]["results"]:
            outs.append(_shape(g.nodes[n]["results"][0]["shape"]))
    return list(dict.fromkeys(ins)), list(dict.fromkeys(outs))


def _module_params(mg, path: str) -> int:
    return sum(p.numel() for p in mg.model.get_submodule(path).parameters())


def _box_label(path: str, g: nx.DiGraph, lay: _Layout, mg, palette: dict[str, str]) -> tuple[str, str, str]:
    run = lay.folded.get(path)
    title = _run_name(run) if run else path
    ins, outs = _boundary(lay.inside[path], g)
    rows = [f"in: {', '.join(ins) or '-'} / out: {', '.join(outs) or '-'}", f"params: {_params(_module_params(mg, path))}"]
    counts: dict[str, int] = defaultdict(int)
    if lay.opts.color_by == "format":
        for n in lay.inside[path]:
            for fmt in {describe_format(f) for f in (g.nodes[n].get("format") or {}).values()}:
                counts[fmt] += 1
    text = "\n".join([f"{title} ({lay.module_type[path]})", *rows, *(f"{f}: {c} nodes" for f, c in sorted(counts.items()))])
    tip = "\n".join([text, f"nodes: {len(lay.inside[path])}", *(["folds: " + ", ".join(run)] if run else [])])
    cells = [f"<b>{html.escape(title)}</b> ({html.escape(lay.module_type[path])})", *map(html.escape, rows)]
    table = "".join(f"<tr><td>{c}</td></tr>" for c in cells) + "".join(
        f'<tr><td bgcolor="{palette.get(f.split("(")[0], _PLAIN)}">{html.escape(f)}: {c} nodes</td></tr>' for f, c in sorted(counts.items())
    )
    return text, f'<<table border="0" cellspacing="0" cellpadding="1">{table}</table>>', tip


def _run_name(run: list[str]) -> str:
    """``bert.encoder.layer.0–11 ×12`` for paths that differ by a trailing index, else the first ``×N``."""
    stem = run[0].rpartition(".")[0]
    last = run[-1].rpartition(".")
    if last[0] == stem and run[0].rpartition(".")[2].isdigit() and last[2].isdigit():
        return f"{run[0]}–{last[2]} ×{len(run)}"
    return f"{run[0]} ×{len(run)}"


def _constants_label(nodes: list[str], g: nx.DiGraph) -> tuple[str, str, str]:
    ops = defaultdict(int)
    for n in nodes:
        ops[g.nodes[n]["op"]] += 1
    _, outs = _boundary(nodes, g)
    rows = [f"{len(nodes)} ops on constants", ", ".join(f"{op} ×{c}" if c > 1 else op for op, c in ops.items()),
            f"out: {', '.join(outs) or '-'}"]
    tip = "\n".join([*rows, "nodes: " + ", ".join(nodes)])
    return "\n".join(rows), "<" + "<br/>".join([f"<b>{html.escape(rows[0])}</b>", *map(html.escape, rows[1:])]) + ">", tip


def _cluster_label(path: str, parent: str, lay: _Layout, mg) -> tuple[str, str]:
    run = lay.folded.get(path)
    name = _run_name(run) if run else path
    short = name[len(parent) + 1 :] if parent and name.startswith(parent + ".") else name
    text = f"{short} ({lay.module_type[path]})"
    ins, outs = _boundary(lay.inside[path], lay.g)
    tip = [path, lay.module_type[path], f"params: {_module_params(mg, path):,}", f"in: {', '.join(ins)}",
           f"out: {', '.join(outs)}", *(["folds: " + ", ".join(run)] if run else [])]
    return text, "\n".join(tip)


def _scale(value: float, lo: float, hi: float, end: tuple[int, int, int]) -> str:
    t = 0.0 if hi <= lo else (value - lo) / (hi - lo)
    rgb = [round(255 + (c - 255) * t) for c in end]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _colouring(g: nx.DiGraph, lay: _Layout, opts: DrawOptions):
    """Fill colour per drawn unit, legend rows ``(colour, text)`` and a note when there is no data."""
    by = opts.color_by
    if by == "type":
        return {}, [], None, {}
    per_unit: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for n in lay.shown:
        key = lay.colour_key(n)
        if key is not None:
            per_unit[lay.unit(n)].append((key, g.nodes[n]))
    if not per_unit:
        what = {"format": "no node has a number format (run quantize first)",
                "sparsity": "no node is pruned (run prune first)"}.get(by, f"no node has profile statistic {by} (run profile first)")
        logger.warning("draw: color_by %s: %s", by, what)
        return {}, [], f"color_by {by}: {what}", {}
    if by == "format":
        names = sorted({k for vals in per_unit.values() for k, _ in vals})
        palette = {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(names)}
        colours = {}
        for u, vals in per_unit.items():
            keys = {k for k, _ in vals}
            colours[u] = palette[keys.pop()] if len(keys) == 1 else _PLAIN
        widths: dict[str, set[str]] = defaultdict(set)
        for vals in per_unit.values():
            for _, a in vals:
                for fmt in a["format"].values():
                    widths[_format_name(fmt)].add(describe_format(fmt))
        palette.update({name: _PALETTE[(len(palette) + i) % len(_PALETTE)] for i, name in enumerate(sorted(set(widths) - set(palette)))})
        legend = [(palette[name], "; ".join(sorted(widths[name]))) for name in sorted(widths)]
        legend.append((_PLAIN, "not quantized"))
        return colours, legend, None, palette
    values = {u: [k for k, _ in vals] for u, vals in per_unit.items()}
    if by == "sparsity":
        lo, hi, end = 0.0, 1.0, (215, 48, 31)
        agg = {u: sum(v) / len(v) for u, v in values.items()}
    else:
        agg = {u: (min(v) if by.endswith(".min") else max(v) if by.endswith(".max") else sum(v) / len(v)) for u, v in values.items()}
        lo, hi, end = min(agg.values()), max(agg.values()), (33, 102, 172)
    colours = {u: _scale(v, lo, hi, end) for u, v in agg.items()}
    stops = [lo + (hi - lo) * i / 4 for i in range(5)]
    legend = [(_scale(s, lo, hi, end), f"{by} {s:.0%}" if by == "sparsity" else f"{by} {s:.4g}") for s in stops]
    legend.append((_PLAIN, "no data" if by != "sparsity" else "not pruned"))
    return colours, legend, None, {}


def _legend(rows: list[tuple[str, str]], note: str | None) -> str:
    cells = "".join(
        f'<tr><td bgcolor="{c}" width="14"> </td><td align="left">{html.escape(t)}</td></tr>' for c, t in rows
    )
    if note:
        cells += f'<tr><td colspan="2" align="left"><font color="#b00000">{html.escape(note)}</font></td></tr>'
    return f'<<table border="0" cellborder="1" cellspacing="0" cellpadding="3">{cells}</table>>'


def draw(mg, path: str | Path, **given: Any) -> Path:
    """Render ``mg`` to ``path`` (format from the extension) with :class:`DrawOptions` ``given``."""
    return render(mg, options(path, **given))[0]


def render(mg, opts: DrawOptions) -> tuple[Path, Drawing | None]:
    """Write ``opts.path``; returns it and the drawing (``None`` for a networkx export)."""
    path = Path(opts.path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise UserError(f"draw: cannot tell the format of {path.name!r}; use one of: {', '.join(FORMATS)}")
    ensure_dir(path.parent, "draw.path")
    if fmt in ("graphml", "json"):
        with staged_file(path) as tmp:
            write_graph(to_networkx(mg), tmp, fmt)
        return path, None
    drawing = build(mg, opts)
    if fmt == "dot":
        with staged_file(path) as tmp:
            tmp.write_text(drawing.graph.source)
        return path, drawing
    dot = shutil.which("dot")
    if dot is None:
        raise UserError(
            "draw: graphviz's `dot` program is not installed (Debian/Ubuntu: apt-get install graphviz; "
            "macOS: brew install graphviz); write a .dot file instead to skip rendering"
        )
    try:
        with staged_file(path) as tmp:
            subprocess.run([dot, f"-T{fmt}", "-o", str(tmp)], input=drawing.graph.source.encode(), check=True,
                           timeout=opts.timeout, capture_output=True)
    except subprocess.TimeoutExpired:
        raise UserError(f"draw: dot took longer than {opts.timeout:g} s on {drawing.boxes} boxes; "
                        "draw fewer with depth or fold_repeats") from None
    except subprocess.CalledProcessError as err:
        raise UserError(f"draw: dot failed: {err.stderr.decode(errors='replace').strip()}") from None
    return path, drawing
