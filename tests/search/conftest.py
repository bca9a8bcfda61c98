import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# A model and data small enough that a trial takes about a second.
# The default model (bert-tiny's shape) cut to one narrow layer.
TINY_MODEL = {
    "hf_config": {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
    }
}

TINY_PIPELINE = {
    "name": "tiny_ptq",
    "seed": 0,
    "data": {"dataset": "synthetic-sentiment", "n_train": 64, "n_test": 64, "max_length": 16},
    "model": TINY_MODEL,
    "steps": [
        {"pass": "train", "params": {"max_steps": 2, "batch_size": 8, "progress": False}},
        {
            "pass": "quantize",
            "params": {
                "by": "type",
                "rules": {
                    "linear": {
                        "name": "integer",
                        "data_in_width": 8,
                        "data_in_frac_width": 4,
                        "weight_width": 8,
                        "weight_frac_width": 4,
                    }
                },
            },
        },
        {"pass": "avg_bits", "params": {"dims": {"batch": 1, "seq": 16}}},
        {"pass": "evaluate", "params": {"label": "ptq", "progress": False}},
    ],
}

WIDTH = "steps.quantize.params.rules.linear.weight_width"


def search_spec(tmp_path: Path, **overrides) -> dict:
    spec = {
        "pipeline": TINY_PIPELINE,
        "space": [{"path": WIDTH, "type": "choice", "values": [4, 8]}],
        "objectives": [{"metric": "ptq.loss", "direction": "minimize"}],
        "sampler": {"name": "grid", "seed": 0},
        "n_trials": 2,
        "output_dir": str(tmp_path / "search"),
        "heartbeat_interval": 1,
        "grace_period": 2,
    }
    spec.update(overrides)
    return spec


def write_spec(tmp_path: Path, spec: dict, name: str = "search.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return path


def start_worker(spec_path: Path) -> subprocess.Popen:
    """``mase-lite search spec`` in its own process."""
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}  # one core each, as the search guide advises
    return subprocess.Popen(
        [sys.executable, "-m", "mase_lite.cli", "search", str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


@pytest.fixture
def tiny_search(tmp_path):
    return lambda **overrides: search_spec(tmp_path, **overrides)


class Postgres:
    """A throwaway PostgreSQL server on 127.0.0.1, run as the postgres system user (it refuses root)."""

    def __init__(self, bindir: Path, base: Path):
        self.bindir, self.base = bindir, base
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run([*self.as_postgres, self.bindir / "pg_ctl", "-D", self.base / "data", *args], check=True, capture_output=True)

    def init(self) -> None:
        subprocess.run([*self.as_postgres, self.bindir / "initdb", "-D", self.base / "data", "-A", "trust", "-U", "postgres"],
                       check=True, capture_output=True)

    def start(self) -> None:
        opts = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.base} -c fsync=off"
        self._ctl("-o", opts, "-l", str(self.base / "log"), "-w", "start")

    def stop(self) -> None:
        self._ctl("-m", "immediate", "-w", "stop")


@pytest.fixture
def postgres():
    """A started :class:`Postgres`, stopped and removed at the end."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        pytest.skip("no PostgreSQL server binaries (Debian package 'postgresql')")
    pytest.importorskip("psycopg", reason="the psycopg driver is a dev extra")
    base = Path(tempfile.mkdtemp(prefix="mase_lite_pg_"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    server = Postgres(Path(bins[-1]).parent, base)
    server.init()
    server.start()
    try:
        yield server
    finally:
        subprocess.run([*server.as_postgres, server.bindir / "pg_ctl", "-D", base / "data", "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres):
    return postgres.url
