import math

import pytest
import torch
import torch.nn as nn
from transformers.modeling_outputs import SequenceClassifierOutput

from mase_lite.infra.errors import UserError
from mase_lite.workloads import evaluate_model
from mase_lite.workloads.data import DataModule
from mase_lite.workloads.sources import TextSplit
from mase_lite.workloads.tokenizer import train_wordpiece

L = math.log(3.0)


class WordVote(nn.Module):
    """Logits [0, ln 3] for 'good', [ln 3, 0] for 'bad', [0, 0] (a tie) otherwise."""

    def __init__(self, good: int, bad: int):
        super().__init__()
        self.good, self.bad = good, bad
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask, labels):
        word = input_ids[:, 1]
        logits = torch.zeros(len(word), 2)
        logits[word == self.good, 1] = L
        logits[word == self.bad, 0] = L
        return SequenceClassifierOutput(loss=None, logits=logits + self.dummy)


@pytest.fixture
def vote_data():
    test = TextSplit(["good", "bad", "good", "meh"], [1, 0, 0, 1])
    tok = train_wordpiece(["good bad meh"])
    return DataModule(TextSplit(["good", "bad"], [1, 0]), test, tok, max_length=4)


def test_accuracy_loss_per_class_and_confusion_exact(vote_data):
    vocab = vote_data.tokenizer.get_vocab()
    model = WordVote(vocab["good"], vocab["bad"]).train()
    m = evaluate_model(model, vote_data, batch_size=3, progress=False)
    assert m["accuracy"] == 0.5 and m["n"] == 4 and m["split"] == "test"
    expected_loss = (2 * math.log(4 / 3) + math.log(4) + math.log(2)) / 4
    assert m["loss"] == pytest.approx(expected_loss, rel=1e-6)
    assert m["per_class"] == {
        "0": {"support": 2, "predicted": 2, "correct": 1},
        "1": {"support": 2, "predicted": 2, "correct": 1},
    }
    assert m["confusion"] == [[1, 1], [1, 1]]
    assert model.training


def test_wrong_number_of_logits_is_named(vote_data):
    class ThreeWay(nn.Module):
        def forward(self, input_ids, attention_mask, labels):
            return torch.zeros(len(input_ids), 3)

    with pytest.raises(UserError, match=r"logits of shape \[2, 3\]; the data has 2 classes, so \[batch, 2\] is expected"):
        evaluate_model(ThreeWay(), vote_data, batch_size=2, progress=False)


def test_output_without_logits_is_named(vote_data):
    class Words(nn.Module):
        def forward(self, input_ids, attention_mask, labels):
            return ["not", "logits"]

    with pytest.raises(UserError, match=r"cannot find logits in the model's output \(list\)"):
        evaluate_model(Words(), vote_data, progress=False)
