import os
import shutil
import signal
import subprocess
from contextlib import ExitStack, contextmanager

import pytest
import torch

# Seconds a test waits on what it tests (a worker, a subprocess) before it fails: far above what a busy machine
# takes (a wait that passed alone in 24 s timed out at 120 s beside load 16-28), below CI's 90 minutes. A passing
# test never waits this long; only a real hang does.
PATIENCE = 1800

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/mase_lite_inductor_cache")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MASE_LITE_EXPORT_CACHE", "0")  # tests that use the on-disk export cache turn it on
os.environ.setdefault("MASE_LITE_PROGRESS", "0")  # stderr holds what a test checks; tests/test_progress.py turns it on
if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers share the cores: each gets its part of them as torch threads
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
# the CLI in a test keeps this process's count (assigned, not defaulted: xdist's workers inherit the controller's)
os.environ["MASE_LITE_THREADS"] = str(torch.get_num_threads())


@pytest.fixture(scope="session", autouse=True)
def _private_state(tmp_path_factory):
    """This user's state (the signing key of cache entries) in a directory of the session, never the home
    directory's; the CLI run in a subprocess inherits it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture(autouse=True)
def _isolated_trust():
    """What one test named as trusted (a spec's factory, a --plugin, --trust-code) does not leak into the next."""
    from mase_lite.infra import trust

    flag, named, plugins = list(trust._trust), set(trust._named), set(trust._plugin_modules)
    yield
    trust._trust[:] = flag
    trust._named.clear()
    trust._named.update(named)
    trust._plugin_modules.clear()
    trust._plugin_modules.update(plugins)


@pytest.fixture(autouse=True)
def _every_thread(monkeypatch):
    """Native kernels run on torch's thread count, as a test sets it: the adaptive choice (timing-dependent) is
    tested on its own (tests/numerics/test_adaptive_threads.py)."""
    from mase_lite.numerics.native import threads

    monkeypatch.setattr(threads, "ADAPTIVE", False)


@pytest.fixture
def cold_capture_cache():
    """No graph captured before the test is reused in it (tests of capture itself; elsewhere a model of an
    architecture an earlier test captured is a cache hit, as in a user's session)."""
    from mase_lite.ir.capture_cache import CACHE

    CACHE.clear()
    yield
    CACHE.clear()


def tiny_bert_config(**overrides):
    from transformers import BertConfig

    kwargs = dict(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, vocab_size=1000
    )
    kwargs.update(overrides)
    return BertConfig(**kwargs)


@pytest.fixture
def tiny_bert():
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(tiny_bert_config()).eval()


@contextmanager
def _mounted(path, options):
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]
    if not shutil.which("mount") or subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(name, size="16m", read_only=False)``: a small file system mounted under tmp_path for the test."""
    with ExitStack() as stack:
        yield lambda name, size="16m", read_only=False: stack.enter_context(
            _mounted(tmp_path / name, f"size={size}" + (",ro" if read_only else ""))
        )


@pytest.fixture
def hang_guard():
    """A hang (a FIFO opened, a count looped over) fails the test in 10 s instead of stalling the suite."""
    def stop(signum, frame):
        raise TimeoutError("hung")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
