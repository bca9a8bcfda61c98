"""A CLI run held at a step until told to go on, for tests that act while a run is alive."""

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import PATIENCE

WAIT_PASS = f'''
import time
from pathlib import Path
from mase_lite.passes import PassParams, PassResult, register_pass

class WaitParams(PassParams):
    started: str
    go: str

@register_pass("wait_for_go", kind="analysis", params=WaitParams)
def wait_for_go(mg, params):
    """Say the run has started, then wait until told to go on."""
    Path(params.started).touch()
    deadline = time.monotonic() + {PATIENCE}
    while not Path(params.go).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return PassResult(metrics={{"waited": True}})
'''


def wait_step(tmp_path: Path) -> dict:
    """A pipeline step that says it started (``tmp_path/started``) and waits for ``tmp_path/go``."""
    return {"pass": "wait_for_go", "params": {"started": str(tmp_path / "started"), "go": str(tmp_path / "go")}}


def start_waiting_run(tmp_path: Path, spec: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    """``mase-lite run spec`` (with the waiting pass as a plug-in) in a new process, once its waiting step started."""
    (tmp_path / "wait_pass.py").write_text(WAIT_PASS)
    proc = subprocess.Popen([sys.executable, "-m", "mase_lite.cli", "--plugin", str(tmp_path / "wait_pass.py"), "run", spec],
                            stdout=stdout, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + PATIENCE
    while not (tmp_path / "started").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not (tmp_path / "started").exists():
        proc.kill()
        raise AssertionError(f"the run did not reach its waiting step: {proc.communicate()[1]}")
    return proc
