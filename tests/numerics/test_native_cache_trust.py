"""The native kernel cache loads only what this user built: a library planted by another user, in a cache directory
another user owns or may write, or whose bytes are not the ones recorded at build time, never runs (a canary
library writes a file when loaded); the kernel is built again, privately where the directory is not this user's."""

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mase_lite.numerics import native

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or native._compiler() is None, reason="no C compiler")
SOURCE = Path(native.__file__).parent / "blocks.c"
NOBODY = 65534


def canary(tmp_path: Path, target: Path) -> Path:
    """Build, at ``target``, a library whose loading writes ``tmp_path/ran``; returns that path."""
    ran = tmp_path / "ran"
    code = tmp_path / "canary.c"
    code.write_text('#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {\n'
                    f'    FILE *f = fopen("{ran}", "w"); if (f) fclose(f);\n}}\n')
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-shared", "-fPIC", str(code), "-o", str(target)], check=True)
    return ran


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("MASE_LITE_CACHE", str(root))
    native._private_build_dir.cache_clear()
    return root / "native"


def load():
    compiler, _ = native._compiler()
    return native._load(compiler, SOURCE.stem, (SOURCE,), ())


def test_a_library_this_user_built_is_loaded_from_the_cache(cache):
    lib = load()
    target = cache / native.cached_name(SOURCE.stem, (SOURCE,))
    assert Path(lib._name) == target and native._verified(target)
    assert oct(target.stat().st_mode & 0o777) == "0o700"


def test_bytes_that_are_not_the_recorded_ones_are_built_again(cache, tmp_path):
    load()
    target = cache / native.cached_name(SOURCE.stem, (SOURCE,))
    ran = canary(tmp_path, target)  # this user's file, but not the library the record describes
    lib = load()
    assert not ran.exists() and native._verified(target) and Path(lib._name) == target


@pytest.mark.skipif(os.getuid() != 0, reason="planting a file of another user needs root")
def test_a_library_another_user_planted_never_runs(cache, tmp_path):
    target = cache / native.cached_name(SOURCE.stem, (SOURCE,))
    cache.mkdir(parents=True, mode=0o700)
    ran = canary(tmp_path, target)
    native._record(target).write_text(__import__("hashlib").sha256(target.read_bytes()).hexdigest())
    os.chown(target, NOBODY, NOBODY)
    os.chown(native._record(target), NOBODY, NOBODY)
    lib = load()
    assert not ran.exists() and Path(lib._name) == target and target.stat().st_uid == os.getuid()


@pytest.mark.parametrize("how", ["world-writable", "another owner"])
def test_a_cache_directory_not_this_users_alone_is_never_used(how, cache, tmp_path, caplog):
    if how == "another owner" and os.getuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    target = cache / native.cached_name(SOURCE.stem, (SOURCE,))
    cache.mkdir(parents=True)
    ran = canary(tmp_path, target)
    native._record(target).write_text(__import__("hashlib").sha256(target.read_bytes()).hexdigest())
    if how == "world-writable":
        cache.chmod(0o777)
    else:
        os.chown(cache, NOBODY, NOBODY)
    with caplog.at_level(logging.WARNING):
        lib = load()
    assert not ran.exists()
    assert Path(lib._name).parent == native._private_build_dir() and Path(lib._name).parent != cache
    assert "not using the native kernel cache" in caplog.text and "private temporary directory" in caplog.text
