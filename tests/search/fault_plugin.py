"""Passes whose writes fail as on a full disk while their ``flag`` file exists: one raises the error a
full disk gives (a fault-injecting writer), one writes ``mb`` megabytes for real (on a small tmpfs)."""

import errno
from pathlib import Path

from pydantic import Field

from mase_lite.passes import PassParams, PassResult, register_pass


class FullParams(PassParams):
    flag: str = Field(description="the disk is full while this file exists")
    mb: int = Field(0, description="test_fill: megabytes to write while the flag exists")


@register_pass("test_disk_full", kind="analysis", params=FullParams)
def disk_full(mg, params, ctx):
    target = ctx.path("weights.bin")
    if Path(params.flag).exists():
        raise OSError(errno.ENOSPC, "No space left on device", str(target))
    target.write_bytes(b"")
    return PassResult()


@register_pass("test_fill", kind="analysis", params=FullParams)
def fill(mg, params, ctx):
    with open(ctx.path("fill.bin"), "wb") as f:
        for _ in range(params.mb if Path(params.flag).exists() else 0):
            f.write(bytes(1 << 20))
    return PassResult()
