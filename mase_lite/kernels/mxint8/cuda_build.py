"""Build the MXINT8 CUDA kernels at first use, where CUDA torch and nvcc exist.

``cuda_extension()`` returns the compiled module, or ``None`` (logged once, with the reason) on
machines without a GPU, a CUDA build of torch or nvcc; callers then take the torch path. Set
``MASE_LITE_NO_CUDA_KERNELS=1`` to force that path.

Example::

    >>> ext = cuda_extension()          # None on a CPU-only machine
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

KERNEL_SOURCE = Path(__file__).with_name("mxint8_kernels.cu")
BINDING_SOURCE = Path(__file__).with_name("mxint8_binding.cpp")
EXTENSION_NAME = "mase_lite_mxint8"
DISABLE_ENV = "MASE_LITE_NO_CUDA_KERNELS"


def unavailable_reason() -> str | None:
    """Why the CUDA kernels cannot be built here, or ``None`` if they can."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return f"{DISABLE_ENV} is set"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is not a CUDA build"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    if find_nvcc() is None:
        return "nvcc was not found (set CUDA_HOME or put nvcc on PATH)"
    return None


def find_nvcc() -> str | None:
    """Path of nvcc: under CUDA_HOME as torch sees it, else on PATH."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME:
        candidate = Path(cpp_extension.CUDA_HOME, "bin", "nvcc")
        if candidate.exists():
            return str(candidate)
    return shutil.which("nvcc")


def build_cuda_extension() -> ModuleType:
    """Compile (or load from torch's extension cache) the kernels; raises if that fails."""
    from torch.utils.cpp_extension import load

    logger.info("building the MXINT8 CUDA kernels (first use; cached afterwards)")
    return load(name=EXTENSION_NAME, sources=[str(BINDING_SOURCE), str(KERNEL_SOURCE)],
                extra_cflags=["-O3"], extra_cuda_cflags=["-O3"], verbose=False)


@functools.cache
def cuda_extension() -> ModuleType | None:
    """The compiled kernels, or ``None`` where they cannot be built (reason logged once)."""
    reason = unavailable_reason()
    if reason is not None:
        logger.info("MXINT8 CUDA kernels unavailable (%s); using the torch path", reason)
        return None
    try:
        return build_cuda_extension()
    except (OSError, RuntimeError, ImportError) as error:
        logger.warning("building the MXINT8 CUDA kernels failed; using the torch path: %s", error)
        return None
