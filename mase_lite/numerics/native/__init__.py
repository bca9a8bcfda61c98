"""Optional native kernels: C sources (beside this file unless a caller names their folder), compiled
on first use and loaded with ctypes.

The system C compiler (``$CC``, else ``cc``) builds each source once per machine into
``$MASE_LITE_CACHE/native`` (default ``~/.cache/mase_lite/native``), named by a digest of the
source and the headers beside it, the flags, the compiler's version and the machine, and written whole (a temporary file
renamed into place). Where there is no compiler or the build fails, :func:`library` returns None
once logged, and callers keep their torch implementation; ``MASE_LITE_NATIVE=0`` chooses that
implementation always. ctypes releases the GIL during a call, so calls on separate row ranges run
in parallel threads.

>>> lib = library("blocks")     # a ctypes.CDLL, or None without a C compiler
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

FLAGS = ("-O3", "-std=c11", "-shared", "-fPIC")
SOURCES = Path(__file__).parent


def enabled() -> bool:
    """Whether native kernels may be used (``MASE_LITE_NATIVE`` is not ``0``)."""
    return os.environ.get("MASE_LITE_NATIVE", "1") != "0"


def cache_root() -> Path:
    """Where mase_lite keeps what it builds for this user: ``$MASE_LITE_CACHE``, else ``~/.cache/mase_lite``."""
    return Path(os.environ.get("MASE_LITE_CACHE") or Path.home() / ".cache" / "mase_lite")


def cache_dir() -> Path:
    return cache_root() / "native"


@functools.cache
def _compiler() -> tuple[str, str] | None:
    """The C compiler's path and ``--version`` text, looked up once per process (None, said once, without one)."""
    name = os.environ.get("CC", "cc")
    path = shutil.which(name)
    if path is None:
        logger.warning("no C compiler (%s) found: quantizers and packed MXINT8 layers run as slower torch "
                       "operations; install one or set CC", name)
        return None
    try:
        return path, subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        logger.warning("the C compiler %s does not run (%s): quantizers and packed MXINT8 layers run as slower "
                       "torch operations", path, err)
        return None


@functools.cache
def library(name: str, directory: Path = SOURCES, openmp: bool = False) -> ctypes.CDLL | None:
    """The compiled ``<directory>/<name>.c`` loaded, or None (native kernels disabled, no compiler, failed build).

    ``openmp`` builds it with ``-fopenmp`` where the compiler can (else without: the source must build
    both ways). Torch is loaded first, so the library's ``libgomp.so.1`` is the one torch already has
    (the loader reuses a loaded soname): its parallel regions run on torch's own OpenMP threads.
    """
    if not enabled() or _compiler() is None:
        return None
    compiler, _ = _compiler()
    source = Path(directory) / f"{name}.c"
    try:
        if openmp:
            try:
                return _load(compiler, source, ("-fopenmp",))
            except (OSError, subprocess.SubprocessError) as err:
                logger.info("building %s with OpenMP failed (%s): building it without", name, err)
        return _load(compiler, source, ())
    except (OSError, subprocess.SubprocessError) as err:
        logger.warning("building the native %s kernel failed (%s): its torch implementation runs instead", name, err)
        return None


def _load(compiler: str, source: Path, extra: tuple[str, ...]) -> ctypes.CDLL:
    """``source`` built with ``extra`` flags (once: the cache) and loaded."""
    texts = [p.read_text() for p in (source, *sorted(source.parent.glob("*.h")))]  # the headers it may include
    key = hashlib.sha256("\0".join([*texts, *FLAGS, *extra, _compiler()[1], platform.machine()]).encode())
    target = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        _build(compiler, source, target, extra)
    try:
        return ctypes.CDLL(str(target))
    except OSError:  # a damaged file in the cache: build it again
        _build(compiler, source, target, extra)
        try:
            return ctypes.CDLL(str(target))
        except OSError:  # the compiler's own output does not load: keep nothing of it
            target.unlink(missing_ok=True)
            raise


def _build(compiler: str, source: Path, target: Path, extra: tuple[str, ...] = ()) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *FLAGS, *extra, str(source), "-o", tmp, "-lm"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise OSError(f"{compiler} exited {result.returncode}: {result.stderr.strip()[:2000]}")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
