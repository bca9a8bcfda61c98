"""Search workers killed at every point of a trial's life, on the journal storage and on PostgreSQL (a throwaway
server started on 127.0.0.1 as the ``postgres`` user): part of the ``kills`` part of benchmarks/robustness.py.

A worker runs the search with one point of the engine made to SIGKILL its own process the k-th time it is reached:
before ``ask``, between ``ask`` and the trial's first heartbeat, in the middle of the trial, at ``tell`` (before the
result is recorded) and just after it. Then a second worker resumes the study. Right: it exits 0, every trial that
had finished before the kill is kept with its values, and every grid point has exactly one complete trial.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.search.conftest import Postgres  # noqa: E402  the suite's throwaway server

POINTS = ["before ask", "between ask and heartbeat", "mid-trial", "at tell", "after tell"]
WIDTHS = [4, 5, 6, 8]
KILLED_AT = """
import os, signal, sys, threading, random
import optuna
import mase_lite.search.engine as engine
from mase_lite.cli import main

point, at = sys.argv[2], int(sys.argv[3])
seen = [0]

def reached():
    seen[0] += 1
    return seen[0] == at

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def wrap(owner, name, before=None, after=None):
    original = getattr(owner, name)
    def call(*args, **kwargs):
        if before is not None and reached():
            before()
        result = original(*args, **kwargs)
        if after is not None and reached():
            after()
        return result
    setattr(owner, name, call)

if point == "before ask":
    wrap(optuna.Study, "ask", before=die)
elif point == "between ask and heartbeat":
    wrap(engine, "heartbeat", before=die)
elif point == "mid-trial":
    wrap(engine, "run_trial", before=lambda: threading.Timer(random.Random(at).uniform(0.05, 0.5), die).start())
elif point == "at tell":
    wrap(optuna.Study, "tell", before=die)
elif point == "after tell":
    wrap(optuna.Study, "tell", after=die)
sys.exit(main(["search", sys.argv[1]]))
"""


def _complete(storage: Any) -> dict[int, tuple[Any, tuple]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    trials = optuna.load_study(study_name="search", storage=storage).get_trials()
    return {t.number: (t.params["w"], tuple(t.values)) for t in trials if t.state.name == "COMPLETE"}


def _server() -> Postgres | None:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        return None
    base = Path(tempfile.mkdtemp(prefix="mase_lite_pg_"))  # under /tmp: the postgres user cannot enter the work folder
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    server = Postgres(Path(bins[-1]).parent, base)
    server.init()
    server.start()
    return server


def study_kill_cases(seed: int, work: Path, pipeline: dict, resume: Callable[[Path], int],
                     kills_per_point: int = 2) -> list[dict[str, Any]]:
    """One record per (storage, point, k) — ``target``, ``what``, ``code`` (the resuming worker's exit), ``ok`` and
    ``why`` — see the module's docstring; ``resume(search_json)`` runs the second worker and returns its exit code."""
    from mase_lite.search.storage import open_storage

    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    server = _server()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    cases = []
    try:
        storages = {"journal": None, **({"postgresql": None} if server else {})}
        for storage in storages:
            for point in POINTS:
                for _ in range(kills_per_point):
                    at = rng.randint(1, 3)
                    sdir = Path(tempfile.mkdtemp(prefix="study-", dir=work))
                    url = None
                    if storage == "postgresql":
                        name = sdir.name.replace("-", "_").lower()
                        subprocess.run([*server.as_postgres, server.bindir / "createdb", "-h", "127.0.0.1", "-p",
                                        str(server.port), "-U", "postgres", name], check=True, capture_output=True)
                        url = server.url.rsplit("/", 1)[0] + f"/{name}"
                    search = {"pipeline": pipeline, "space": [{"path": "steps.quantize.params.rules.linear.weight_width",
                                                               "type": "choice", "values": WIDTHS, "name": "w"}],
                              "objectives": [{"metric": "ptq.loss", "direction": "minimize"}],
                              "sampler": {"name": "grid", "seed": at}, "n_trials": len(WIDTHS),
                              "output_dir": str(sdir / "out"), "heartbeat_interval": 1, "grace_period": 2,
                              **({"storage": url} if url else {})}
                    (sdir / "search.json").write_text(json.dumps(search))
                    killed = subprocess.run([sys.executable, "-c", KILLED_AT, str(sdir / "search.json"), point, str(at)],
                                            env=env, capture_output=True, text=True, timeout=600)
                    opened = url or open_storage(None, sdir / "out", heartbeat_interval=1)
                    finished = _complete(opened)
                    code = resume(sdir / "search.json")
                    final = _complete(url or open_storage(None, sdir / "out", heartbeat_interval=1))
                    lost = {n: v for n, v in finished.items() if final.get(n) != v}
                    points = sorted(p for p, _ in final.values())
                    ok = killed.returncode == -9 and code == 0 and not lost and points == WIDTHS
                    cases.append({"target": f"search worker ({storage})", "code": code, "ok": ok,
                                  "what": f"SIGKILL {point} (the {at}. time), {len(finished)} trials finished before",
                                  "why": "" if ok else (f"killed worker exit {killed.returncode}, resume exit {code}, "
                                                        f"lost {lost}, grid points complete {points}")})
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(server.base, ignore_errors=True)
    return cases
