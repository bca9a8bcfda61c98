"""``import mase_lite`` sets GNU OpenMP's spin count before torch loads it, unless the environment already says how
idle threads wait (mase_lite.infra.spinning)."""

import os
import subprocess
import sys

import pytest

PRINT = "import mase_lite, os; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in __import__('sys').modules)"


def spin_count(**environ):
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")} | environ
    return subprocess.run([sys.executable, "-c", PRINT], capture_output=True, text=True, env=env, check=True).stdout.split()


@pytest.mark.parametrize("environ,expected", [({}, ["10000", "False"]),
                                              ({"GOMP_SPINCOUNT": "300000"}, ["300000", "False"]),
                                              ({"OMP_WAIT_POLICY": "ACTIVE"}, ["None", "False"])])
def test_import_sets_the_spin_count_before_torch_unless_given(environ, expected):
    assert spin_count(**environ) == expected
