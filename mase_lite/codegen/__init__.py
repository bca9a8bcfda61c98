"""Codegen: a MaseGraph as a standalone package (``model.py``, ``weights.safetensors``, ``load()``).

Example::

    from mase_lite.codegen import write_package
    write_package(mg, "out/bert_mx")     # then: import bert_mx; model = bert_mx.load("cpu")
"""

from mase_lite.codegen.emit import emit, write_package
from mase_lite.codegen.modules import CodegenError

__all__ = ["CodegenError", "emit", "write_package"]
