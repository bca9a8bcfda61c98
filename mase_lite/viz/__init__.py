"""Views of a MaseGraph: graphviz drawings (:mod:`~mase_lite.viz.draw`) and networkx graphs (:mod:`~mase_lite.viz.nx`).

They read the IR and its metadata; the IR imports none of them (``mg.draw`` and ``mg.to_networkx``
load them on call).
"""
