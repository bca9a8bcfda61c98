"""A save killed between the renames of a replace loses nothing: the next load or save recovers."""

import subprocess
import sys
import textwrap

import pytest
import torch

import mase_lite as ml
from tests.robustness.nets import tiny

CHILD = textwrap.dedent('''
    import os, signal, sys, torch
    from pathlib import Path
    import mase_lite as ml, mase_lite.infra.files as files
    from tests.robustness.nets import tiny

    target, kill_before = Path(sys.argv[1]), sys.argv[2]
    def save(fill):
        model = tiny()
        torch.nn.init.constant_(model[0].weight, fill)
        mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(2, 4)})
        ml.passes.save(mg, {"path": str(target), "tokenizer": False})
    save(1.0)
    real = os.replace
    def replace(src, dst):
        if Path(dst).name.startswith(f".{target.name}.{kill_before}-"):
            if kill_before == "old":
                real(src, dst)          # the old checkpoint is aside, the new one not yet in
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst)
    files.os.replace = replace
    save(2.0)
''')


@pytest.mark.parametrize("kill_before, survivor", [("ready", 1.0), ("old", 2.0)])
def test_a_save_killed_mid_replace_loses_nothing(tmp_path, kill_before, survivor):
    target = tmp_path / "ckpt"
    child = subprocess.run([sys.executable, "-c", CHILD, str(target), kill_before], capture_output=True, text=True)
    assert child.returncode == -9, child.stderr
    leftovers = sorted(p.name.split("-")[0] for p in tmp_path.iterdir() if p.name.startswith("."))
    assert leftovers == ([".ckpt.staging"] if kill_before == "ready" else [".ckpt.old", ".ckpt.ready"])
    assert target.exists() == (kill_before == "ready")
    loaded = ml.load(target, model=tiny())   # recovers: a complete checkpoint is back at its place
    assert torch.equal(loaded.model.get_submodule("0").weight, torch.full((4, 4), survivor))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    mg = ml.MaseGraph(tiny(), example_inputs={"input": torch.randn(2, 4)})
    ml.passes.save(mg, {"path": str(target), "tokenizer": False})   # a later save does not refuse
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors", "recipe.json"]


def test_a_save_refuses_only_what_is_not_a_checkpoint(tmp_path):
    mg = ml.MaseGraph(tiny(), example_inputs={"input": torch.randn(2, 4)})
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(ml.UserError, match=r"notes exists and is not a checkpoint; refusing to replace it"):
        ml.passes.save(mg, {"path": str(tmp_path / "notes"), "tokenizer": False})
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
