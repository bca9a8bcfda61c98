"""Files and directories written whole or not at all, with the modes the umask gives, and crash-safe replace."""

import os
import stat

import pytest

import mase_lite.files as files
from mase_lite.files import recover, staged_directory, staged_file


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_modes_follow_the_umask(tmp_path, umask_022):
    with staged_file(tmp_path / "report.json") as tmp:
        tmp.write_text("{}")
    with staged_directory(tmp_path / "ckpt") as tmp:
        (tmp / "w").write_text("x")
    assert _mode(tmp_path / "report.json") == 0o644
    assert _mode(tmp_path / "ckpt") == 0o755 and _mode(tmp_path / "ckpt" / "w") == 0o644
    os.umask(0o077)
    with staged_file(tmp_path / "private.json") as tmp:
        tmp.write_text("{}")
    assert _mode(tmp_path / "private.json") == 0o600


def test_a_run_writes_report_and_drawing_with_ordinary_modes(tmp_path, umask_022):
    import mase_lite as ml

    spec = {"data": {"n_train": 16, "n_test": 8}, "steps": [{"pass": "draw", "params": {"path": "g.dot"}}], "output_dir": str(tmp_path)}
    ml.run_pipeline(spec)
    assert _mode(tmp_path / "report.json") == 0o644 and _mode(tmp_path / "g.dot") == 0o644


def test_a_crash_between_the_renames_keeps_a_complete_version(tmp_path, monkeypatch):
    target = tmp_path / "ckpt"
    with staged_directory(target) as tmp:
        (tmp / "v").write_text("1")
    real_replace = os.replace
    calls = []

    def crash_on_the_second_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 3:  # staging -> ready, target -> old, then the crash before ready -> target
            raise KeyboardInterrupt("killed")
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", crash_on_the_second_rename)
    monkeypatch.setattr(files, "_alive", lambda pid: False)  # as seen by the next process
    with pytest.raises(KeyboardInterrupt), staged_directory(target) as tmp:
        (tmp / "v").write_text("2")
    monkeypatch.setattr(files.os, "replace", real_replace)
    assert not target.exists()
    recover(target)
    assert (target / "v").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_crash_while_writing_leaves_the_old_version_and_no_staging(tmp_path, monkeypatch):
    target = tmp_path / "ckpt"
    with staged_directory(target) as tmp:
        (tmp / "v").write_text("1")
    stale = tmp_path / ".ckpt.staging-999999999-abc"
    stale.mkdir()
    with pytest.raises(OSError), staged_directory(target) as tmp:
        raise OSError("disk full")
    assert (target / "v").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
