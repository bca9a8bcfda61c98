"""The search package's modules import each other one way (no cycle, function-level imports included)."""

import networkx as nx

from tests.test_layering import IMPORTS


def test_the_search_has_no_import_cycle():
    search = {name for name in IMPORTS if name.startswith("mase_lite.search.")}
    graph = nx.DiGraph()
    graph.add_nodes_from(search)
    graph.add_edges_from((name, m) for name in search for m in IMPORTS[name] if m in search)
    assert ("mase_lite.search.engine", "mase_lite.search.results") in graph.edges  # the engine writes the results
    assert list(nx.simple_cycles(graph)) == []
