"""Causal-LM and seq2seq data: windows and stride exact, perplexity by hand, corpora from files and the hub path."""

import json
import math

import pytest
import torch

from mase_lite.infra.errors import UserError
from mase_lite.workloads.data import DataSpec, build_data
from mase_lite.workloads.evaluator import evaluate_model
from mase_lite.workloads.language import token_stream, window_count, windows
from mase_lite.workloads.tasks import TASKS
from mase_lite.workloads.tokenizer import train_wordpiece


@pytest.mark.parametrize("tokens,block,stride", [(10, 4, 2), (10, 4, 4), (17, 5, 3), (4, 4, 4), (5, 4, 1), (2, 8, 8)])
def test_windows_cover_the_stream_and_score_every_token_after_the_first_once(tokens, block, stride):
    stream = torch.arange(100, 100 + tokens)
    w = windows(stream, block, stride, pad_id=0)
    n = window_count(tokens, block, stride)
    assert w["input_ids"].shape == (n, block)
    predicted = []
    for k in range(n):
        real = w["attention_mask"][k].bool()
        assert torch.equal(w["input_ids"][k][real], stream[k * stride : k * stride + block])
        assert (w["input_ids"][k][~real] == 0).all() and (w["labels"][k][~real] == -100).all()
        # causal shift: position t >= 1 predicts labels[t] from the tokens before it in the window
        predicted += [int(w["labels"][k, t]) for t in range(1, block) if w["labels"][k, t] != -100]
    expected = [int(x) for x in stream[1:]] if stride < block else [int(x) for i, x in enumerate(stream) if i % block]
    assert sorted(predicted) == expected
    assert len(set(predicted)) == len(predicted)  # nothing scored twice


def test_window_limit_keeps_the_first_windows():
    w = windows(torch.arange(50), 8, 8, pad_id=0, limit=3)
    assert w["input_ids"].tolist() == torch.arange(24).view(3, 8).tolist()


def test_token_stream_joins_documents_with_the_end_of_text_token():
    tok = train_wordpiece(["the cat sat", "a dog ran"])
    stream = token_stream(tok, ["the cat", "a dog", "ran"])
    ids = tok(["the cat", "a dog", "ran"], add_special_tokens=False)["input_ids"]
    assert stream.tolist() == ids[0] + [tok.eos_token_id] + ids[1] + [tok.eos_token_id] + ids[2]
    assert tok.eos_token == "[SEP]" and tok.pad_token_id == 0


class FixedLogits(torch.nn.Module):
    """A 'language model' whose next-token distribution is the same everywhere: softmax of ``scores``."""

    def __init__(self, scores):
        super().__init__()
        self.scores = torch.nn.Parameter(torch.tensor(scores))

    def forward(self, input_ids, attention_mask=None, labels=None):
        return self.scores.expand(*input_ids.shape, -1)


def test_perplexity_is_the_exponential_of_the_token_weighted_mean_loss_over_the_split():
    scores = [0.0, 1.0, 2.0, -1.0]
    logp = torch.log_softmax(torch.tensor(scores, dtype=torch.float64), 0)
    labels = torch.tensor([[3, 1, 2, -100], [0, 0, 2, 1], [1, 0, -100, -100]])
    meter = TASKS["causal-lm"].meter(None)
    logits = FixedLogits(scores)(labels.clamp(min=0))
    meter.update(logits[:2], {"labels": labels[:2]})  # two batches: 5 predicted tokens, then 1
    meter.update(logits[2:], {"labels": labels[2:]})
    batches = [[1, 2, 0, 2, 1], [0]]  # shifted: each row's first label is context only
    nll = [-float(logp[t]) for t in batches[0] + batches[1]]
    result = meter.result()
    assert result["tokens"] == 6 and result["n"] == 3
    assert result["loss"] == pytest.approx(sum(nll) / 6, rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(sum(nll) / 6), rel=1e-6)
    assert result["accuracy"] == pytest.approx(2 / 6)  # class 2 has the top score
    mean_of_batches = sum(math.exp(-sum(float(logp[t]) for t in b) / len(b)) for b in batches) / 2
    assert abs(mean_of_batches - result["perplexity"]) > 0.1  # what a per-batch average would have said


def test_seq2seq_labels_are_not_shifted():
    scores = [0.5, -0.5, 0.0]
    logp = torch.log_softmax(torch.tensor(scores, dtype=torch.float64), 0)
    labels = torch.tensor([[2, 0, -100]])
    meter = TASKS["seq2seq-lm"].meter(None)
    meter.update(FixedLogits(scores)(labels.clamp(min=0)), {"labels": labels})
    assert meter.result()["loss"] == pytest.approx(-(float(logp[2]) + float(logp[0])) / 2, rel=1e-6)


def test_evaluate_streams_a_language_model_over_the_split_and_reports_the_grammar_bound():
    data = build_data({"n_train": 6, "n_test": 5, "block_size": 16}, task="causal-lm", seed=3)
    assert (data.size("train"), data.size("test")) == (6, 5) and data.tensors["test"]["input_ids"].shape == (5, 16)
    vocab = data.vocab_size
    model = FixedLogits([0.0] * vocab)
    metrics = evaluate_model(model, data, batch_size=2, input_names=["input_ids"], progress=False)
    assert metrics["tokens"] == 5 * 15 and metrics["perplexity"] == pytest.approx(vocab, rel=1e-5)
    grammar = data.reference
    assert metrics["perplexity_entropy_rate"] == pytest.approx(math.exp(grammar.entropy_rate()))
    assert 1 < metrics["perplexity_bound"] < vocab
    # the bound is the grammar's own loss on exactly the scored tokens
    words = [[grammar.word_ids([data.tokenizer.convert_ids_to_tokens(int(i))])[0] for i in row]
             for row in data.tensors["test"]["input_ids"]]
    scored = torch.ones(5, 16, dtype=torch.bool)
    scored[:, 0] = False
    total, count = grammar.window_loss(torch.tensor(words), scored)
    assert metrics["perplexity_bound"] == pytest.approx(math.exp(total / count), rel=1e-12)


def test_no_bound_when_the_tokenizer_splits_the_corpus_words(tmp_path):
    other = train_wordpiece(["a few unrelated words"], vocab_size=60)
    other.save_pretrained(str(tmp_path / "tok"))
    data = build_data({"n_train": 2, "n_test": 2, "block_size": 8, "tokenizer": str(tmp_path / "tok")}, task="causal-lm")
    assert data.reference_metrics("test") == {}


def test_corpus_from_text_files_single_file_tail_and_directory(tmp_path):
    lines = [f"line number {i} of the corpus" for i in range(10)]
    (tmp_path / "all.txt").write_text("\n".join(lines) + "\n\n")
    data = build_data({"dataset": "txt", "path": str(tmp_path / "all.txt"), "block_size": 8, "test_fraction": 0.2},
                      task="causal-lm")
    assert data.documents["train"] == lines[:8] and data.documents["test"] == lines[8:]  # a corpus keeps its order
    tok = data.tokenizer
    assert torch.equal(data.tensors["test"]["input_ids"][data.tensors["test"]["attention_mask"].bool()],
                       token_stream(tok, lines[8:]))
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"content": t}) + "\n" for t in lines[:6]))
    (folder / "test.jsonl").write_text("".join(json.dumps({"content": t}) + "\n" for t in lines[6:]))
    data = build_data({"dataset": "json", "path": str(folder), "text_column": "content", "block_size": 8}, task="causal-lm")
    assert data.documents["test"] == lines[6:]
    with pytest.raises(UserError, match=r"train.jsonl: no column 'text' \(data.text_column\); its columns are: content"):
        build_data({"dataset": "json", "path": str(folder), "block_size": 8}, task="causal-lm")


def test_hub_path_reads_a_local_text_directory_with_the_datasets_library(tmp_path):
    folder = tmp_path / "wiki"
    folder.mkdir()
    (folder / "train.txt").write_text("the first line\nthe second line\n")
    (folder / "test.txt").write_text("a test line\n")
    data = build_data({"dataset": str(folder), "block_size": 4}, task="causal-lm", run_dir=tmp_path / "run")
    assert data.documents == {"train": ["the first line", "the second line"], "test": ["a test line"]}
    assert (tmp_path / "run" / "hf_cache").is_dir()


def test_seq2seq_pairs_targets_end_with_the_end_of_text_token_and_pad_with_ignore():
    data = build_data({"n_train": 8, "n_test": 4, "max_length": 16, "max_target_length": 6}, task="seq2seq-lm", seed=1)
    source, target = data.pairs["test"][0][0], data.pairs["test"][1][0]
    assert target.split()[:-1] == source.split()[:-1][::-1]  # the synthetic task: the words reversed
    labels = data.tensors["test"]["labels"][0]
    ids = data.tokenizer(target, add_special_tokens=False)["input_ids"][:5] + [data.tokenizer.eos_token_id]
    assert labels[: len(ids)].tolist() == ids and (labels[len(ids):] == -100).all()


@pytest.mark.parametrize("task,field,value", [
    ("causal-lm", "max_length", 16), ("causal-lm", "label_column", "y"), ("sequence-classification", "block_size", 8),
    ("image-classification", "vocab_size", 100), ("seq2seq-lm", "stride", 2),
])
def test_a_field_of_another_task_is_refused_by_name(task, field, value):
    with pytest.raises(UserError, match=rf"^data.{field}: not used by {task} data"):
        build_data({field: value}, task=task)


def test_dataset_of_another_task_and_stride_above_block_are_refused():
    with pytest.raises(UserError, match=r"data.dataset = 'synthetic-sentiment' is sequence-classification data, not "
                                         r"causal-lm data; for causal-lm: csv, json, synthetic-grammar, txt"):
        build_data({"dataset": "synthetic-sentiment"}, task="causal-lm")
    with pytest.raises(ValueError, match=r"stride \(9\) must be at most block_size \(8\)"):
        DataSpec(block_size=8, stride=9)
