"""Passes: every registered pass is an attribute of this module, by name.

Example::

    import mase_lite as ml
    mg, info = ml.passes.count(mg)
    mg, info = ml.passes.quantize(mg, {"by": "type", "default": {"name": None}, "linear": {...}})
"""

from mase_lite.passes.manager import PassContext, PassInstrument, PassRun, instrument
from mase_lite.passes.registry import (
    NoParams,
    PassError,
    PassInfo,
    PassParams,
    PassResult,
    all_passes,
    get_pass,
    register_pass,
)


def __getattr__(name: str) -> PassInfo:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return get_pass(name)
    except PassError as err:
        raise AttributeError(str(err)) from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(all_passes()))


__all__ = [
    "NoParams",
    "PassContext",
    "PassError",
    "PassInfo",
    "PassInstrument",
    "PassParams",
    "PassResult",
    "PassRun",
    "all_passes",
    "get_pass",
    "instrument",
    "register_pass",
]
