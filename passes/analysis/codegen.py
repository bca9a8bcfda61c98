"""The ``codegen`` pass: write the graph as a standalone PyTorch package (it does not change the graph)."""

from __future__ import annotations

from pydantic import Field

from mase_lite.passes.registry import PassParams, PassResult, register_pass


class CodegenParams(PassParams):
    path: str = Field(..., min_length=1, description="package directory to write (its name is the import name), "
                                                     "relative to the run")
    class_name: str | None = Field(None, pattern=r"^[A-Za-z_]\w*$",
                                   description="name of the emitted nn.Module class (default: the model's class name)")


@register_pass("codegen", kind="analysis", params=CodegenParams)
def codegen_pass(mg, params: CodegenParams, ctx):
    """Write model.py, weights.safetensors and load(): packed MXINT8 Linear layers call the kernel op.

    Example: ``ml.passes.codegen(mg, {"path": "out/bert_mx"})``, then ``import bert_mx; bert_mx.load("cpu")``
    with ``out`` on ``sys.path``.
    """
    from mase_lite.codegen import write_package

    return PassResult(write_package(mg, ctx.path(params.path), params.class_name))
