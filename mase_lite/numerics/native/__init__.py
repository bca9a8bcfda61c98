"""Optional native kernels: C sources (beside this file unless a caller names their folder), compiled
on first use and loaded with ctypes.

The system C compiler (``$CC``, else ``cc``) builds each source once per machine into
``$MASE_LITE_CACHE/native`` (default ``~/.cache/mase_lite/native``), named by a digest of the
source and the headers beside it, the flags, the compiler's version and the machine, and written whole (a temporary file
renamed into place), with the SHA-256 of the library it wrote recorded beside it. A cached library is loaded only
when it, its record and the directory belong to this user and no one else may write them, and the library's bytes
are the ones recorded; anything else is built again. A cache directory that is not this user's alone (another
owner, or writable by others) is never used: the libraries are built in a private temporary directory instead
(said once). Where there is no compiler or the build fails, :func:`library` returns None
once logged, and callers keep their torch implementation; ``MASE_LITE_NATIVE=0`` chooses that
implementation always. ctypes releases the GIL during a call, so calls on separate row ranges run
in parallel threads.

>>> lib = library("blocks")     # a ctypes.CDLL, or None without a C compiler
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from mase_lite.infra.files import private

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
def _private_build_dir() -> Path:
    """A directory of this process's own (removed at exit), for libraries when the cache is not this user's alone."""
    path = Path(tempfile.mkdtemp(prefix="mase_lite_native_"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _build_dir() -> Path:
    """The cache directory when this user alone may write it (created so), else a private temporary one."""
    place = cache_dir()
    try:
        place.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as err:
        return _fallback(place, f"it cannot be created ({err.strerror})")
    if not private(place) or not private(place.parent):
        return _fallback(place, "it is not this user's alone (another owner, or writable by others)")
    return place


_REFUSED: set[Path] = set()  # cache directories said to be refused (once each)


def _fallback(place: Path, why: str) -> Path:
    if place not in _REFUSED:
        logger.warning("not using the native kernel cache %s: %s; building the kernels in a private temporary "
                       "directory for this process", place, why)
        _REFUSED.add(place)
    return _private_build_dir()


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
def library(name: str, directory: Path = SOURCES, openmp: bool = False,
            sources: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The compiled ``<directory>/<name>.c`` loaded, or None (native kernels disabled, no compiler, failed build);
    with ``sources``, those files of ``directory`` built into one library called ``name``.

    ``openmp`` builds it with ``-fopenmp`` where the compiler can (else without: the source must build
    both ways). Torch is loaded first, so the library's ``libgomp.so.1`` is the one torch already has
    (the loader reuses a loaded soname): its parallel regions run on torch's own OpenMP threads.
    """
    if not enabled() or _compiler() is None:
        return None
    compiler, _ = _compiler()
    files = tuple(Path(directory) / f for f in sources) or (Path(directory) / f"{name}.c",)
    try:
        if openmp:
            try:
                return _load(compiler, name, files, ("-fopenmp",))
            except (OSError, subprocess.SubprocessError) as err:
                logger.info("building %s with OpenMP failed (%s): building it without", name, err)
        return _load(compiler, name, files, ())
    except (OSError, subprocess.SubprocessError) as err:
        logger.warning("building the native %s kernel failed (%s): its torch implementation runs instead", name, err)
        return None


def cached_name(name: str, sources: tuple[Path, ...], extra: tuple[str, ...] = ()) -> str:
    """The file name of library ``name`` built from ``sources`` with ``extra`` flags: a digest of the sources, the headers
    they include (``#include "..."``, through other headers too), the flags, the compiler's version and the machine."""
    texts = [p.read_text() for source in sources for p in _included(Path(source))]
    key = hashlib.sha256("\0".join([*texts, *FLAGS, *extra, _compiler()[1], platform.machine()]).encode())
    return f"{name}-{key.hexdigest()[:16]}.so"


def _included(source: Path) -> list[Path]:
    """``source`` and the files its quoted includes name, each once, found as the compiler finds them (beside the
    file that includes them)."""
    found, pending = [], [source.resolve()]
    while pending:
        path = pending.pop(0)
        if path in found or not path.is_file():
            continue
        found.append(path)
        pending += [(path.parent / m.group(1)).resolve() for m in _INCLUDE.finditer(path.read_text())]
    return found


_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def _load(compiler: str, name: str, sources: tuple[Path, ...], extra: tuple[str, ...]) -> ctypes.CDLL:
    """``sources`` built into library ``name`` with ``extra`` flags (once: the cache) and loaded."""
    target = _build_dir() / cached_name(name, sources, extra)
    if not _verified(target):
        _build(compiler, sources, target, extra)
    try:
        return ctypes.CDLL(str(target))
    except OSError:  # the compiler's own output does not load: keep nothing of it
        target.unlink(missing_ok=True)
        _record(target).unlink(missing_ok=True)
        raise


def _record(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _verified(target: Path) -> bool:
    """Whether ``target`` is a library this user built: it and its record are this user's alone, and its bytes
    have the digest recorded when it was built."""
    record = _record(target)
    if not (private(target) and private(record)):
        return False
    try:
        return hashlib.sha256(target.read_bytes()).hexdigest() == record.read_text().strip()
    except OSError:
        return False


def _build(compiler: str, sources: tuple[Path, ...], target: Path, extra: tuple[str, ...] = ()) -> None:
    """Build ``target`` (replacing whatever stood there) and record its digest beside it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *FLAGS, *extra, *map(str, sources), "-o", tmp, "-lm"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise OSError(f"{compiler} exited {result.returncode}: {result.stderr.strip()[:2000]}")
        digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
        os.chmod(tmp, 0o700)
        _record(target).unlink(missing_ok=True)
        os.replace(tmp, target)
        fd, record = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "w") as file:
            file.write(digest)
        os.replace(record, _record(target))
    finally:
        Path(tmp).unlink(missing_ok=True)
