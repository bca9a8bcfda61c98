"""No trial or study is lost to the tool's own I/O: a full disk stops the worker (exit 2, naming the path
and the free space) and the trial reruns on resume; a torn or garbage last journal record is dropped,
real corruption is refused naming the line; a damaged prefix-cache entry is discarded and rebuilt; a
different spec on a study is refused; a restarting PostgreSQL server is waited for."""

import copy
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.infra.errors import UserError
from mase_lite.passes.manager import PassContext
from mase_lite.pipeline.runner import run_pipeline
from mase_lite.pipeline.spec import load_spec
from mase_lite.search import journal
from mase_lite.search.cache import PrefixCache
from mase_lite.search.storage import open_storage
from tests.conftest import PATIENCE
from tests.search.conftest import TINY_PIPELINE, WIDTH, start_worker, write_spec

HERE = Path(__file__).parent


def _trials(out: Path, name: str = "search") -> list:
    storage = open_storage(None, out, heartbeat_interval=1)
    return optuna.load_study(study_name=name, storage=storage).get_trials()


def test_a_full_disk_stops_the_worker_and_the_trial_reruns_on_resume(tmp_path, tiny_search, capsys):
    flag = tmp_path / "full"
    pipeline = copy.deepcopy(TINY_PIPELINE)
    pipeline["plugins"] = [str(HERE / "fault_plugin.py")]
    pipeline["steps"].append({"pass": "test_disk_full", "params": {"flag": str(flag)}})
    path = write_spec(tmp_path, tiny_search(pipeline=pipeline))
    flag.touch()
    assert main(["search", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    out = tmp_path / "search"
    assert err.startswith(f"mase-lite: error: {out / 'trials' / '0' / 'weights.bin'}: No space left on device (")
    assert " MB free on " in err and "Traceback" not in err
    (trial, retry) = _trials(out)
    assert trial.state == TrialState.FAIL and "error" not in trial.user_attrs  # not the trial's own failure
    assert retry.state == TrialState.WAITING and retry.system_attrs["failed_trial"] == 0
    flag.unlink()  # space freed
    assert main(["search", str(path)]) == 0
    report = json.loads((out / "search_report.json").read_text())["studies"][0]
    assert report["states"] == {"COMPLETE": 2, "FAIL": 1}
    assert sorted(t["params"][WIDTH] for t in report["trials"] if t["state"] == "COMPLETE") == [4, 8]


def test_a_really_full_disk_stops_the_worker_and_the_trial_reruns_on_resume(tmp_path, tiny_search, tmpfs, capsys):
    disk, flag = tmpfs("disk", size="24m"), tmp_path / "fill"
    pipeline = copy.deepcopy(TINY_PIPELINE)
    pipeline["plugins"] = [str(HERE / "fault_plugin.py")]
    pipeline["steps"].append({"pass": "test_fill", "params": {"flag": str(flag), "mb": 64}})
    path = write_spec(tmp_path, tiny_search(pipeline=pipeline, output_dir=str(disk / "search")))
    flag.touch()
    assert main(["search", str(path)]) == 2
    err = capsys.readouterr().err
    assert "No space left on device (" in err and f" MB free on {disk}" in err and "Traceback" not in err
    flag.unlink()
    assert main(["search", str(path)]) == 0
    report = json.loads((disk / "search" / "search_report.json").read_text())["studies"][0]
    assert report["states"] == {"COMPLETE": 2, "FAIL": 1} and all(t["error"] is None for t in report["trials"])


def test_a_failed_journal_write_is_cut_back_off(tmp_path, monkeypatch):
    storage = open_storage(None, tmp_path, heartbeat_interval=1)
    study = optuna.create_study(storage=storage, study_name="s")
    study.tell(study.ask(), 1.0)
    before = (tmp_path / "study.journal").read_bytes()

    class HalfWritten:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(journal, "open", lambda *a, **k: HalfWritten(open(*a, **k)), raising=False)
    with pytest.raises(OSError, match="No space left on device"):
        study.ask()
    monkeypatch.undo()
    assert (tmp_path / "study.journal").read_bytes() == before
    again = optuna.load_study(study_name="s", storage=open_storage(None, tmp_path, heartbeat_interval=1))
    again.tell(again.ask(), 2.0)
    assert [t.value for t in again.get_trials()] == [1.0, 2.0]


@pytest.fixture
def journal_file(tmp_path):
    """A journal whose last record ends trial 1 (trial 0 complete before it)."""
    study = optuna.create_study(storage=open_storage(None, tmp_path, heartbeat_interval=1), study_name="s")
    for value in (1.0, 2.0):
        trial = study.ask()
        trial.suggest_int("x", 0, 9)
        study.tell(trial, value)
    return tmp_path / "study.journal"


def _states(directory: Path) -> list[str]:
    study = optuna.load_study(study_name="s", storage=open_storage(None, directory, heartbeat_interval=1))
    return [t.state.name for t in study.get_trials()]


def test_a_journal_cut_at_any_byte_of_its_last_record_opens(journal_file, tmp_path):
    data = journal_file.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    for cut in range(start, len(data)):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        (directory / "study.journal").write_bytes(data[:cut])
        assert _states(directory) == ["COMPLETE", "RUNNING"], cut  # trial 1 runs again once its heartbeat is stale
        assert (directory / "study.journal").read_bytes() == data[:start]
    assert _states(journal_file.parent) == ["COMPLETE", "COMPLETE"]


@pytest.mark.parametrize("garbage", [b"\xff\xfe\x00garbage\n", b"[1, 2]\n", b'{"op_code": 99}\n', b'{"op_code": 6}\n',
                                     b'{"op_code": 4, "worker_id": "w", "study_id": 0, "datetime_start": 5}\n'])
def test_a_garbage_last_record_is_dropped_and_earlier_garbage_refused(journal_file, garbage, capsys, tiny_search):
    data = journal_file.read_bytes()
    journal_file.write_bytes(data + garbage)
    assert _states(journal_file.parent) == ["COMPLETE", "COMPLETE"]
    assert journal_file.read_bytes() == data
    lines = data.splitlines(keepends=True)
    journal_file.write_bytes(b"".join(lines[:2]) + garbage + b"".join(lines[2:]))
    with pytest.raises(UserError, match=rf"study.journal: line 3 of {len(lines) + 1} is not a journal record"):
        open_storage(None, journal_file.parent, heartbeat_interval=1)
    spec = tiny_search(output_dir=str(journal_file.parent))
    assert main(["search", str(write_spec(journal_file.parent.parent, spec))]) == 2
    err = capsys.readouterr().err
    assert f"{journal_file}: line 3 of {len(lines) + 1} is not a journal record" in err and "Traceback" not in err
    assert not (journal_file.parent / "trials").exists()


def _entry(tmp_path) -> tuple[dict, Path]:
    pipeline = {**TINY_PIPELINE, "steps": TINY_PIPELINE["steps"][:1]}
    run_pipeline(pipeline, tmp_path / "run", cache=PrefixCache(tmp_path / "cache", 1))
    (entry,) = (tmp_path / "cache").iterdir()
    return pipeline, entry


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _retype(path: Path) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), "facts": 5}))


DAMAGE = {
    "rng truncated": lambda e: _truncate(e / "rng.safetensors"),
    "rng garbage": lambda e: (e / "rng.safetensors").write_bytes(b"\x00" * 64),
    "rng missing": lambda e: (e / "rng.safetensors").unlink(),
    "state truncated": lambda e: _truncate(e / "state.json"),
    "state retyped": lambda e: _retype(e / "state.json"),
    "state empty": lambda e: (e / "state.json").write_text(""),
    "weights truncated": lambda e: _truncate(e / "graph" / "model.safetensors"),
    "weights missing": lambda e: (e / "graph" / "model.safetensors").unlink(),
    "recipe garbage": lambda e: (e / "graph" / "recipe.json").write_text('{"model": "bert"}'),
    "checksums missing": lambda e: (e / "checksums.json").unlink(),
    "checksums garbage": lambda e: (e / "checksums.json").write_text("[]"),
    "a file too many": lambda e: (e / "extra").write_text("x"),
    "a fifo": lambda e: os.mkfifo(e / "graph" / "fifo"),
    # planted: the checksums written again to match, signed with this user's key
    "device meta": lambda e: _planted(e, lambda: _restate(e / "state.json", device="meta")),
    "device of no such machine": lambda e: _planted(e, lambda: _restate(e / "state.json", device="xla:3")),
    "a file others may write": lambda e: _planted(e, lambda: os.chmod(e / "graph" / "model.safetensors", 0o666)),
    "an entry others may write": lambda e: _planted(e, lambda: os.chmod(e, 0o777)),
}
if os.geteuid() == 0:  # only root can give a file to another user
    DAMAGE["a file of another user"] = lambda e: _planted(e, lambda: os.chown(e / "state.json", 65534, 65534))


def _restate(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _planted(entry: Path, change) -> None:
    """``change`` made by this user, the entry signed again with its key: caught by the checks after the signature."""
    from mase_lite.search.cache import seal
    from mase_lite.infra.signing import user_key

    change()
    seal(entry, entry.name, user_key())


def test_a_damaged_cache_entry_is_discarded_and_rebuilt(tmp_path):
    pipeline, entry = _entry(tmp_path)
    good = tmp_path / "good"
    shutil.copytree(entry, good)
    spec = load_spec(pipeline)
    for kind, damage in DAMAGE.items():
        shutil.rmtree(entry, ignore_errors=True)
        shutil.copytree(good, entry)
        damage(entry)
        cache = PrefixCache(tmp_path / "cache", 1)
        assert cache.restore(spec, PassContext(output_dir=tmp_path / "x")) is None, kind
        assert [p.name for p in (tmp_path / "cache").iterdir()] == [], kind
    result = run_pipeline(pipeline, tmp_path / "again", cache=PrefixCache(tmp_path / "cache", 1))  # rebuilt
    assert [s.get("cached", False) for s in result.report["steps"]] == [False]
    restored = PrefixCache(tmp_path / "cache", 1).restore(spec, PassContext(output_dir=tmp_path / "y"))
    assert restored is not None and restored[0] == 1


def _rescaled(entry: Path, secret: bytes) -> None:
    """The entry's weights doubled, its checksums written again and signed with ``secret``."""
    from safetensors.torch import load_file, save_file

    from mase_lite.search.cache import seal

    weights = entry / "graph" / "model.safetensors"
    save_file({k: v * 2 if v.is_floating_point() else v for k, v in load_file(str(weights)).items()}, str(weights))
    seal(entry, entry.name, secret)


def test_an_entry_signed_with_another_key_is_discarded_and_the_trial_reports_the_true_metrics(tmp_path, caplog):
    from mase_lite.infra.signing import user_key

    true = run_pipeline(TINY_PIPELINE, tmp_path / "true", cache=PrefixCache(tmp_path / "cache", 1)).report["metrics"]
    (entry,) = (tmp_path / "cache").iterdir()
    good = tmp_path / "good"
    shutil.copytree(entry, good)
    _rescaled(entry, user_key())  # this user's own change: used, and it would change the metrics
    own = run_pipeline(TINY_PIPELINE, tmp_path / "own", cache=PrefixCache(tmp_path / "cache", 1)).report
    assert own["steps"][0]["cached"] and own["metrics"]["ptq"] != true["ptq"]
    shutil.rmtree(entry)
    shutil.copytree(good, entry)
    _rescaled(entry, b"another user's key".ljust(32))
    with caplog.at_level("WARNING", logger="mase_lite.search.cache"):
        planted = run_pipeline(TINY_PIPELINE, tmp_path / "planted", cache=PrefixCache(tmp_path / "cache", 1)).report
    assert "it is not signed with this user's key" in caplog.text
    assert not planted["steps"][0].get("cached") and planted["metrics"] == true
    assert PrefixCache(tmp_path / "cache", 1).restore(load_spec(TINY_PIPELINE), PassContext(output_dir=tmp_path / "x"))


def test_a_damaged_entry_costs_a_search_nothing(tmp_path, tiny_search):
    spec = tiny_search(n_trials=1)
    ml.run_search(spec)
    (entry,) = (tmp_path / "search" / "cache").iterdir()
    DAMAGE["state retyped"](entry)
    report = ml.run_search({**spec, "n_trials": 2}).report
    assert report["studies"][0]["states"] == {"COMPLETE": 2}
    assert [p.name for p in (tmp_path / "search" / "cache").iterdir()] == [entry.name]
    assert json.loads((entry / "state.json").read_text())["facts"] != 5  # written anew


def test_cache_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        _, entry = _entry(tmp_path)
    finally:
        os.umask(old)
    modes = {p.relative_to(entry).as_posix(): oct(p.stat().st_mode & 0o777) for p in [entry, *entry.rglob("*")]}
    assert set(modes.values()) <= {"0o755", "0o644"}, modes


def test_another_spec_on_a_study_is_refused(tmp_path, tiny_search, capsys):
    path = write_spec(tmp_path, tiny_search(n_trials=1))
    assert main(["search", str(path)]) == 0
    other = tiny_search(n_trials=1, space=[{"path": WIDTH, "type": "choice", "values": [4, 6]}])
    assert main(["search", str(write_spec(tmp_path, other, "other.json"))]) == 2
    err = capsys.readouterr().err
    assert f"output_dir: study 'search' in {tmp_path / 'search' / 'study.journal'} was made by another search spec " \
           "(this one differs in space)" in err
    report = json.loads((tmp_path / "search" / "search_report.json").read_text())
    assert report["spec"]["space"][0]["values"] == [4, 8] and len(report["studies"][0]["trials"]) == 1
    assert main(["search", str(write_spec(tmp_path, tiny_search(n_trials=2)))]) == 0  # more trials: the same study
    assert len(_trials(tmp_path / "search")) == 2


def _wait_for(condition, seconds=PATIENCE):
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def _held_search(tmp_path, tiny_search, url, **overrides):
    flag = tmp_path / "hold"
    pipeline = copy.deepcopy(TINY_PIPELINE)
    pipeline["plugins"] = [str(HERE / "hold_plugin.py")]
    pipeline["steps"].append({"pass": "test_hold", "params": {"flag": str(flag), "call": 1}})
    flag.touch()
    worker = start_worker(write_spec(tmp_path, tiny_search(pipeline=pipeline, storage=url, **overrides)))
    _wait_for(lambda: (tmp_path / "holding").exists() or worker.poll() is not None)
    return worker, flag


def test_a_postgresql_restart_mid_search_is_waited_for(tmp_path, tiny_search, postgres):
    worker, flag = _held_search(tmp_path, tiny_search, postgres.url)
    postgres.stop()
    flag.unlink()  # the trial ends while the server is down: telling its result waits for the server
    time.sleep(2)
    postgres.start()
    output = worker.communicate(timeout=PATIENCE)[0]
    assert worker.returncode == 0 and "Traceback" not in output, output
    study = optuna.load_study(study_name="search", storage=postgres.url)
    assert sorted(t.params[WIDTH] for t in study.get_trials(states=(TrialState.COMPLETE,))) == [4, 8]


def test_a_postgresql_server_that_stays_down_stops_the_worker(tmp_path, tiny_search, postgres):
    worker, flag = _held_search(tmp_path, tiny_search, postgres.url, storage_retry=2)
    postgres.stop()
    flag.unlink()
    output = worker.communicate(timeout=PATIENCE)[0]
    assert worker.returncode == 2 and "Traceback" not in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"mase-lite: error: storage: {postgres.url} is unreachable (") and "retried for 2 s" in last
    worker.send_signal(signal.SIGKILL) if worker.poll() is None else None


@pytest.mark.parametrize("kind", ["directory", "fifo", "emptied"])
def test_a_journal_that_is_not_a_study_file_is_refused_naming_it(kind, tmp_path):
    journal = tmp_path / "study.journal"
    if kind == "directory":
        journal.mkdir()
        message = r"study.journal: the study journal is a directory; move it away"
    elif kind == "fifo":
        os.mkfifo(journal)
        message = r"study.journal: the study journal is a FIFO; move it away"
    else:
        journal.write_bytes(b"")
        (tmp_path / "trials.csv").write_text("number,value\n0,1.0\n")
        message = (r"study.journal: the study journal is empty, but .* holds a search's results \(trials.csv\): it was "
                   r"emptied, and its trials would be lost")
    with pytest.raises(UserError, match=message):
        open_storage(None, tmp_path, heartbeat_interval=1)
    journal.unlink() if kind != "directory" else journal.rmdir()
    (tmp_path / "trials.csv").unlink(missing_ok=True)
    open_storage(None, tmp_path, heartbeat_interval=1)  # a new study's journal: absent, then created


def test_a_cache_directory_others_may_write_is_not_read(tmp_path):
    """Anyone could have planted its entries: none is used (nor removed), the prefix simply runs."""
    pipeline, entry = _entry(tmp_path)
    os.chmod(tmp_path / "cache", 0o777)
    cache = PrefixCache(tmp_path / "cache", 1)
    assert cache.restore(load_spec(pipeline), PassContext(output_dir=tmp_path / "x")) is None
    assert entry.is_dir()
    os.chmod(tmp_path / "cache", 0o755)
    assert PrefixCache(tmp_path / "cache", 1).restore(load_spec(pipeline), PassContext(output_dir=tmp_path / "y"))


def test_opening_a_restarting_postgresql_waits_for_it(postgres):
    """A worker started while the server restarts waits for it (storage_retry) instead of exiting at once."""
    postgres.stop()
    starter = threading.Timer(1.0, postgres.start)
    starter.start()
    try:
        started = time.monotonic()
        storage = open_storage(postgres.url, Path("unused"), heartbeat_interval=1, retry=60)
        assert time.monotonic() - started >= 0.9
        optuna.create_study(storage=storage, study_name="s").ask()
    finally:
        starter.join()


def test_opening_a_postgresql_that_stays_down_names_it_after_the_retry(postgres):
    postgres.stop()
    with pytest.raises(UserError) as err:
        open_storage(postgres.url, Path("unused"), heartbeat_interval=1, retry=1)
    message = str(err.value)
    assert message.startswith(f"storage: {postgres.url} is unreachable (") and message.endswith(
        "retried for 1 s (storage_retry)"), message
    assert "\n" not in message


KILLED_AT_ASK = """
import os, signal, sys
import mase_lite.search.engine as engine
from mase_lite.cli import main

def killed(storage, trial_id):  # the worker dies right after study.ask(), before the trial's first heartbeat
    os.kill(os.getpid(), signal.SIGKILL)

engine.heartbeat = killed
main(["search", sys.argv[1]])
"""


@pytest.mark.parametrize("storage", ["journal", "postgresql"])
def test_a_worker_killed_between_ask_and_its_first_heartbeat_is_recovered(tmp_path, tiny_search, request, storage):
    url = request.getfixturevalue("postgres").url if storage == "postgresql" else None
    spec = write_spec(tmp_path, tiny_search(**({"storage": url} if url else {})))
    killed = subprocess.run([sys.executable, "-c", KILLED_AT_ASK, str(spec)], capture_output=True, text=True,
                            env={**os.environ, "TQDM_DISABLE": "1"}, timeout=PATIENCE)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    study = optuna.load_study(study_name="search", storage=url or open_storage(None, tmp_path / "search", 1))
    (asked,) = study.get_trials()
    assert asked.state == TrialState.RUNNING  # asked, never beating: Optuna's own stale check skips it
    assert main(["search", str(spec)]) == 0  # the next worker fails it after the grace period and runs its point again
    trials = optuna.load_study(study_name="search", storage=url or open_storage(None, tmp_path / "search", 1)).get_trials()
    complete = sorted(t.params[WIDTH] for t in trials if t.state == TrialState.COMPLETE)
    assert complete == [4, 8] and [t.state for t in trials].count(TrialState.FAIL) == 1
