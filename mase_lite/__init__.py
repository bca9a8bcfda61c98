"""mase_lite: capture a PyTorch model into a graph IR, then annotate, compress and explore it.

Example::

    import mase_lite as ml
    mg = ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask", "labels"])
    mg, info = ml.passes.count(mg)
    mg.save("runs/g"); mg = ml.load("runs/g")
    result = ml.run_pipeline("pipelines/quickstart.json")
"""

import os

from mase_lite.infra.spinning import calm

calm(os.environ)  # before torch loads OpenMP: idle threads sleep soon on a busy machine (see the module)

from mase_lite.infra import moved  # noqa: E402
from mase_lite.infra.errors import UserError  # noqa: E402

moved.install()  # the modules' names before the layout of 2026-11 keep working (with a warning)

__version__ = "0.1.0"


def __getattr__(name: str):
    """``passes`` and ``MaseGraph`` load on first use, so the kernel runtime imports without the IR."""
    if name == "passes":
        import mase_lite.passes as passes

        return passes
    if name == "MaseGraph":
        from mase_lite.ir.graph import MaseGraph

        return MaseGraph
    raise AttributeError(f"module 'mase_lite' has no attribute {name!r}")


def load(directory, model=None, trust_code=False):
    """A saved graph with its transforms replayed; see :func:`mase_lite.passes.replay.load_graph`."""
    from mase_lite.passes.replay import load_graph

    return load_graph(directory, model=model, trust_code=trust_code)


def run_pipeline(source, output_dir=None):
    """Run a pipeline spec (path, dict or PipelineSpec); see :func:`mase_lite.pipeline.runner.run_pipeline`."""
    from mase_lite.pipeline.runner import run_pipeline as run

    return run(source, output_dir=output_dir)


def run_search(source):
    """Run (or continue) a search spec (path, dict or SearchSpec); see :func:`mase_lite.search.engine.run_search`."""
    from mase_lite.search.engine import run_search as run

    return run(source)


__all__ = ["MaseGraph", "UserError", "load", "passes", "run_pipeline", "run_search", "__version__"]


def __dir__() -> list[str]:
    """The public names, those loaded on first use included (``dir(ml)``, completion)."""
    return sorted(set(globals()) | set(__all__))
