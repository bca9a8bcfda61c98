"""Shared fixtures: tiny data and models for fast tests, and one real default fine-tune run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mase_lite.workloads import DataSpec, ModelSpec

ROOT = Path(__file__).resolve().parents[2]
TINY_BERT = {
    "model_type": "bert",
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run far faster on one thread when other jobs share the two cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_model_spec() -> ModelSpec:
    return ModelSpec(hf_config=TINY_BERT)


@pytest.fixture
def tiny_data_spec() -> DataSpec:
    return DataSpec(n_train=96, n_test=40, max_length=16)


@pytest.fixture(scope="session")
def finetune_run(tmp_path_factory):
    """``pipelines/finetune.json`` run once: the default model trained one epoch, evaluated, saved."""
    import mase_lite as ml

    out = tmp_path_factory.mktemp("finetune")
    return ml.run_pipeline(ROOT / "pipelines" / "finetune.json", output_dir=out)
