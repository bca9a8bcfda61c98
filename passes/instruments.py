"""Instruments for the pass manager: timing, graph-change counts, drawing and verifying after a pass.

A pipeline runs every step with :class:`Timing` and :class:`GraphChange` (their records become the
step's entry in ``report.json``); ``draw_after`` and ``verify_each`` add the other two. A user script
or a search gets the same through :func:`mase_lite.passes.manager.instrument`::

    with instrument(Timing(), VerifyAfterEach()):
        mg, _ = ml.passes.quantize(mg, {...})
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from mase_lite.passes.manager import PassContractError, PassInstrument, PassRun


class Timing(PassInstrument):
    """Wall time of each pass in ``run.record["seconds"]``."""

    def before_pass(self, run: PassRun) -> None:
        run.record["_t0"] = time.perf_counter()

    def after_pass(self, run: PassRun) -> None:
        run.record["seconds"] = time.perf_counter() - run.record.pop("_t0")

    def on_error(self, run: PassRun, error: BaseException) -> None:
        if "_t0" in run.record:
            run.record["seconds"] = time.perf_counter() - run.record.pop("_t0")


def op_counts(mg) -> Counter:
    """How many nodes of each op the graph has."""
    return Counter(n.meta.get("mase", {}).get("op", n.op) for n in mg.nodes)


class GraphChange(PassInstrument):
    """Node counts before and after, and the ops whose counts changed, in ``run.record["graph_change"]``."""

    def before_pass(self, run: PassRun) -> None:
        run.record["_ops"] = op_counts(run.mg)

    def after_pass(self, run: PassRun) -> None:
        before, after = run.record.pop("_ops"), op_counts(run.mg)
        changed = {op: [before.get(op, 0), after.get(op, 0)] for op in sorted(set(before) | set(after))}
        run.record["graph_change"] = {
            "nodes": [sum(before.values()), sum(after.values())],
            "ops": {op: counts for op, counts in changed.items() if counts[0] != counts[1]},
        }

    def on_error(self, run: PassRun, error: BaseException) -> None:
        run.record.pop("_ops", None)


class DrawAfter(PassInstrument):
    """Draw the graph after each pass to ``<directory>/<stem>_<pass>.svg`` (``run.record["drawing"]``)."""

    def __init__(self, directory: str | Path, stem: str = "after"):
        self.directory = Path(directory)
        self.stem = stem

    def after_pass(self, run: PassRun) -> None:
        run.record["drawing"] = str(run.mg.draw(self.directory / f"{self.stem}_{run.info.name}.svg"))


class VerifyAfterEach(PassInstrument):
    """Run the ``verify`` pass's checks after every pass; a failure names the pass that broke the graph."""

    def after_pass(self, run: PassRun) -> None:
        from mase_lite.passes.analysis.verify import verify_graph

        problems: list[str] | Any = verify_graph(run.mg)
        if problems:
            raise PassContractError(f"{run.label} left a graph that fails verification: {'; '.join(problems)}")
        run.record["verified"] = True
