"""A pass that holds a worker mid-trial, so a test can kill it there: on its ``call``-th call in a
process, while the ``flag`` file exists (it touches ``holding`` beside the flag first)."""

import time
from pathlib import Path

from pydantic import Field

from mase_lite.passes import PassParams, PassResult, register_pass

CALLS: list[int] = []


class HoldParams(PassParams):
    flag: str = Field(description="hold while this file exists")
    call: int = Field(2, description="hold on this call of the pass in this process")


@register_pass("test_hold", kind="analysis", params=HoldParams)
def hold(mg, params):
    CALLS.append(1)
    flag = Path(params.flag)
    if len(CALLS) == params.call and flag.exists():
        (flag.parent / "holding").touch()
        while flag.exists():
            time.sleep(0.05)
    return PassResult()
