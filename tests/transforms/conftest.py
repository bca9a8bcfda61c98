"""Shared models for the transform tests: tiny BERT (eager and sdpa attention) and a small CNN.

Capturing BERT takes a second or two, so each graph is captured once per session and every test
gets its own deep copy.
"""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from transformers import BertConfig, BertForSequenceClassification

from mase_lite.ir.graph import MaseGraph

BERT_SHAPE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)


def make_bert(attn_implementation: str = "eager") -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(**BERT_SHAPE, attn_implementation=attn_implementation)
    return BertForSequenceClassification(config).eval()


class SmallCNN(nn.Module):
    """Conv2d + BatchNorm2d + ReLU + pool, then Linear + BatchNorm1d + ReLU + Linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.bn1 = nn.BatchNorm1d(32)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.flatten(self.pool(self.relu(self.bn(self.conv(x)))))
        return self.fc2(self.relu1(self.bn1(self.fc1(x))))


def make_cnn() -> SmallCNN:
    torch.manual_seed(0)
    cnn = SmallCNN()
    with torch.no_grad():
        for bn in (cnn.bn, cnn.bn1):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.normal_()
            bn.bias.normal_()
    return cnn.eval()


def _copy(mg: MaseGraph) -> MaseGraph:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return copy.deepcopy(mg)


@pytest.fixture(scope="session")
def _bert_eager() -> MaseGraph:
    return MaseGraph(make_bert("eager"), hf_input_names=["input_ids", "attention_mask", "labels"])


@pytest.fixture(scope="session")
def _bert_sdpa() -> MaseGraph:
    return MaseGraph(make_bert("sdpa"), hf_input_names=["input_ids", "attention_mask"])


@pytest.fixture(scope="session")
def _cnn() -> MaseGraph:
    return MaseGraph(make_cnn(), example_inputs={"x": torch.randn(4, 3, 8, 8)})


@pytest.fixture
def bert(_bert_eager) -> MaseGraph:
    """BERT (eager attention) captured with input_ids, attention_mask and labels."""
    return _copy(_bert_eager)


@pytest.fixture
def bert_sdpa(_bert_sdpa) -> MaseGraph:
    """BERT (sdpa attention) captured with input_ids and attention_mask."""
    return _copy(_bert_sdpa)


@pytest.fixture
def cnn(_cnn) -> MaseGraph:
    return _copy(_cnn)


@pytest.fixture
def fresh_cnn():
    """Builds a new SmallCNN (what MaseGraph.load needs for a model without a recipe)."""
    return make_cnn


@pytest.fixture
def clone():
    """Deep-copies a MaseGraph (an independent graph and model)."""
    return _copy


@pytest.fixture
def bert_inputs() -> dict:
    gen = torch.Generator().manual_seed(1)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    return {
        "input_ids": torch.randint(0, 1000, (3, 11), generator=gen),
        "attention_mask": mask,
        "labels": torch.tensor([0, 1, 1]),
    }


@pytest.fixture
def cnn_input() -> torch.Tensor:
    return torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(2))

