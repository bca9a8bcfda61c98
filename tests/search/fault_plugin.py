"""A pass whose write fails as on a full disk while its ``flag`` file exists (a fault-injecting writer)."""

import errno
from pathlib import Path

from pydantic import Field

from mase_lite.passes import PassParams, register_pass


class FullParams(PassParams):
    flag: str = Field(description="the disk is full while this file exists")


@register_pass("test_disk_full", kind="analysis", params=FullParams)
def disk_full(mg, params, ctx):
    target = ctx.path("weights.bin")
    if Path(params.flag).exists():
        raise OSError(errno.ENOSPC, "No space left on device", str(target))
    target.write_bytes(b"")
    return mg, {}
