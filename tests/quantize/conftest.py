"""Captured graphs shared by the quantize-pass tests: each test works on its own deep copy."""

import copy

import pytest
import torch
import torch.nn as nn

from mase_lite.ir.graph import MaseGraph


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 4, 3, stride=2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        return self.fc(self.flatten(self.relu(self.conv2(self.relu(self.conv1(x))))))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        h = self.act(self.fc1(x))
        return self.fc2(h) + torch.matmul(x[:, :4], h[:, :4].t()).sum(dim=1, keepdim=True)


@pytest.fixture(scope="session")
def bert_graph():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, attn_implementation="eager"
    )
    model = BertForSequenceClassification(config).eval()
    return MaseGraph(model, hf_input_names=["input_ids", "attention_mask"])


@pytest.fixture
def bert(bert_graph):
    return copy.deepcopy(bert_graph)


@pytest.fixture
def bert_inputs():
    torch.manual_seed(1)
    return {"input_ids": torch.randint(0, 1000, (2, 12)), "attention_mask": torch.ones(2, 12, dtype=torch.long)}


@pytest.fixture(scope="session")
def cnn_graph():
    torch.manual_seed(0)
    return MaseGraph(SmallCNN().eval(), example_inputs={"x": torch.randn(2, 3, 8, 8)})


@pytest.fixture
def cnn(cnn_graph):
    return copy.deepcopy(cnn_graph)


@pytest.fixture(scope="session")
def mlp_graph():
    torch.manual_seed(0)
    return MaseGraph(MLP().eval(), example_inputs={"x": torch.randn(3, 16)})


@pytest.fixture
def mlp(mlp_graph):
    return copy.deepcopy(mlp_graph)


@pytest.fixture
def small_cnn():
    return SmallCNN
