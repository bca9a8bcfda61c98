"""Files and directories written whole or not at all, with the modes the umask gives, and crash-safe replace."""

import os
import stat

import pytest

import mase_lite.infra.files as files
from mase_lite.infra.files import recover, staged_directory, staged_file


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


@pytest.mark.parametrize("name", ["a*", "a?", "[ab]"])
def test_recover_matches_leftovers_by_exact_name(tmp_path, name):
    dead = 999999999  # no such process
    other = [tmp_path / f".ab.ready-{dead}-x1", tmp_path / f".ab.staging-{dead}-x2", tmp_path / f".a.old-{dead}-x3"]
    for path in other:
        path.mkdir()
    own = tmp_path / f".{name}.staging-{dead}-x4"
    own.mkdir()
    recover(tmp_path / name)
    assert not own.exists() and all(p.is_dir() for p in other)  # `a*` touches nothing of `ab` or `a`
    assert not (tmp_path / name).exists() and not (tmp_path / "ab").exists()


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path):
    killed = tmp_path / ".trials.csv.tmp-999999999-abc123"
    killed.write_text("half a table")
    alive = tmp_path / f".trials.csv.tmp-{os.getpid()}-def456"  # a writer at work in this process
    alive.write_text("")
    with staged_file(tmp_path / "trials.csv") as tmp:
        tmp.write_text("a,b\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name, "trials.csv"]


def test_a_symlinked_old_version_is_unlinked_not_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "keep").write_text("x")
    (tmp_path / "ckpt").symlink_to(real)
    with staged_directory(tmp_path / "ckpt") as tmp:
        (tmp / "v").write_text("new")
    assert (real / "keep").read_text() == "x" and (tmp_path / "ckpt" / "v").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "real"]
