import json
import os
import subprocess
import sys
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
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}  # one core each, as the README advises
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
