"""A MaseGraph as a ``networkx`` graph: one node per fx node, edges along the data flow.

Each node carries its metadata as attributes: ``op`` (the mase op), ``node_op`` (the fx op),
``target``, ``module_path`` and ``module_type`` (the module the node runs in, or calls),
``scope`` (the enclosing modules as ``[path, class]`` pairs, outermost first), ``results``
(``shape``/``dtype``/``format`` of each output), ``shapes``, ``dtypes``, ``param_count``;
``format`` (operand -> number format) only when something is quantized, ``sparsity`` (the
weight's masked fraction) only when pruned, ``profile`` only when profiled. The graph is built
on demand and not kept in sync with later changes.

Example::

    >>> import collections, torch, mase_lite as ml
    >>> net = torch.nn.Sequential(collections.OrderedDict(fc=torch.nn.Linear(4, 2), act=torch.nn.ReLU()))
    >>> g = ml.MaseGraph(net, example_inputs={"input": torch.randn(3, 4)}).to_networkx()
    >>> list(g.edges)
    [('input_1', 'fc'), ('fc', 'act'), ('act', 'output')]
    >>> g.nodes["fc"]["module_type"], g.nodes["fc"]["param_count"], g.nodes["fc"]["shapes"]
    ('Linear', 10, [['batch', 2]])
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import networkx as nx
import torch
import torch.fx as fx
from torch.nn.utils import parametrize

from mase_lite.ir.meta import module_class

_OPERANDS = (("args", "data_in"), ("results", "data_out"))


def scope(node: fx.Node, modules: dict[str, torch.nn.Module]) -> list[tuple[str, str]]:
    """The modules enclosing ``node`` as ``(path, class name)``, outermost first; the root and a
    called module itself are left out."""
    own = node.target if node.op == "call_module" else None
    out = []
    for path, cls in (node.meta.get("nn_module_stack") or {}).values():
        if path and path != own and path in modules:
            out.append((path, cls.rsplit(".", 1)[-1] if isinstance(cls, str) else type(modules[path]).__name__))
    return out


def weight_keep_mask(module: torch.nn.Module) -> torch.Tensor | None:
    """The boolean keep-mask of a parametrisation on ``module.weight`` (a pruning mask), if there is one."""
    if not parametrize.is_parametrized(module, "weight"):
        return None
    for p in module.parametrizations["weight"]:
        mask = getattr(p, "mask", None)
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            return mask
    return None


def _format_name(fmt: Any) -> str:
    return fmt if isinstance(fmt, str) else str(fmt.get("name"))


def quantized_formats(meta: dict[str, Any]) -> dict[str, Any]:
    """Operand -> format for the operands of a node whose format is not its plain dtype."""
    found = {}
    for key, operand in _OPERANDS:
        entries = meta.get(key) or []
        if entries and entries[0] and entries[0]["format"] != entries[0]["dtype"]:
            found[operand] = entries[0]["format"]
    for pname, entry in (meta.get("params") or {}).items():
        if entry and not entry.get("buffer") and entry.get("format") not in (None, entry.get("dtype")):
            found[pname] = entry["format"]
    return found


def node_attributes(node: fx.Node, modules: dict[str, torch.nn.Module]) -> dict[str, Any]:
    """The networkx attributes of one fx node (see the module docstring)."""
    meta = node.meta.get("mase") or {}
    enclosing = scope(node, modules)
    module = modules.get(node.target) if node.op == "call_module" else None
    if module is not None:
        path, mtype = str(node.target), module_class(module).__name__
    else:
        path, mtype = enclosing[-1] if enclosing else ("", "")
    results = [r for r in meta.get("results") or [] if r]
    attrs: dict[str, Any] = {
        "op": meta.get("op", node.op),
        "node_op": node.op,
        "target": node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target)),
        "module_path": path,
        "module_type": mtype,
        "scope": [list(s) for s in enclosing],
        "results": results,
        "shapes": [r["shape"] for r in results],
        "dtypes": [r["dtype"] for r in results],
        "param_count": sum(p.numel() for p in module.parameters()) if module is not None else 0,
    }
    formats = quantized_formats(meta)
    if formats:
        attrs["format"] = formats
    keep = weight_keep_mask(module) if module is not None else None
    if keep is not None:
        attrs["sparsity"] = 1.0 - float(keep.count_nonzero()) / max(keep.numel(), 1)
    if meta.get("profile"):
        attrs["profile"] = meta["profile"]
    return attrs


def _uses(node: fx.Node) -> list[fx.Node]:
    """Input nodes of ``node``, once per use (a node passed twice appears twice)."""
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda a: found.append(a) or a)
    return found


def to_networkx(mg) -> nx.DiGraph:
    """``mg``'s graph as a ``networkx.DiGraph`` keyed by node name (a ``MultiDiGraph`` when a
    node feeds another more than once, one edge per use)."""
    modules = dict(mg.model.named_modules())
    nodes = list(mg.model.graph.nodes)
    uses = {n: _uses(n) for n in nodes}
    multi = any(max(Counter(u).values(), default=0) > 1 for u in uses.values())
    g = nx.MultiDiGraph() if multi else nx.DiGraph()
    g.graph["name"] = type(mg.source_model).__name__
    g.add_nodes_from((n.name, node_attributes(n, modules)) for n in nodes)
    g.add_edges_from((a.name, n.name) for n in nodes for a in uses[n])
    return g


def _scalar_attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    """GraphML holds scalars only: lists and dicts become JSON text, ``None`` is left out."""
    out = {}
    for key, value in attrs.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, (str, int, float, bool)) else json.dumps(value, default=str)
    return out


def write_graph(g: nx.DiGraph, path: Path, fmt: str) -> None:
    """Write ``g`` to ``path`` as ``fmt``: ``graphml`` or ``json`` (node-link)."""
    if fmt == "json":
        path.write_text(json.dumps(nx.node_link_data(g, edges="edges"), default=str))
        return
    flat = g.__class__()
    flat.graph.update(_scalar_attributes(g.graph))
    flat.add_nodes_from((n, _scalar_attributes(a)) for n, a in g.nodes(data=True))
    flat.add_edges_from(g.edges())
    nx.write_graphml(flat, path)
