import csv
import json

import re

import pytest
import torch
from pydantic import ValidationError

from mase_lite.infra.errors import UserError
from mase_lite.workloads.data import BatchLoader, DataModule, DataSpec, build_data
from mase_lite.workloads.sources import TextSplit
from mase_lite.workloads.tokenizer import train_wordpiece

TRAIN_ROWS = [
    {"text": "the movie was great", "label": 1},
    {"text": 'a "quoted", comma-laden review', "label": 0},
    {"text": "two\nlines of text", "label": 1},
    {"text": "café crème était superbe", "label": 1},
    {"text": "dull", "label": 0},
    {"text": "", "label": 0},
    {"text": "the plot was not great at all, honestly", "label": 0},
]
TEST_ROWS = [{"text": "great movie", "label": 1}, {"text": "dull plot", "label": 0}, {"text": "meh", "label": 0}]


def write_rows(path, rows, fmt):
    if fmt == "csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows), encoding="utf-8")


def in_memory(train_rows, test_rows, max_length=12):
    train = TextSplit([r["text"] for r in train_rows], [r["label"] for r in train_rows])
    test = TextSplit([r["text"] for r in test_rows], [r["label"] for r in test_rows])
    return DataModule(train, test, train_wordpiece(train.texts), max_length)


def assert_same_batches(a: DataModule, b: DataModule):
    for split in ("train", "test"):
        for left, right in zip(a.loader(split, 3, shuffle=True, seed=5), b.loader(split, 3, shuffle=True, seed=5), strict=True):
            assert left.keys() == right.keys() == {"input_ids", "attention_mask", "labels"}
            for key in left:
                assert torch.equal(left[key], right[key]), (split, key)


@pytest.mark.parametrize("fmt,ext", [("json", "json"), ("json", "jsonl"), ("csv", "csv")])
def test_local_directory_gives_the_same_batches_as_the_in_memory_rows(tmp_path, fmt, ext):
    write_rows(tmp_path / f"train.{ext}", TRAIN_ROWS, ext)
    write_rows(tmp_path / f"test.{ext}", TEST_ROWS, ext)
    loaded = build_data({"dataset": fmt, "path": str(tmp_path), "max_length": 12})
    assert_same_batches(loaded, in_memory(TRAIN_ROWS, TEST_ROWS))
    assert loaded.num_labels == 2 and loaded.input_names == ["input_ids", "attention_mask", "labels"]


def test_single_file_is_split_by_test_fraction_into_a_seeded_partition(tmp_path):
    rows = [{"text": f"row number {i}", "label": i % 3} for i in range(20)]
    write_rows(tmp_path / "all.csv", rows, "csv")
    spec = {"dataset": "csv", "path": str(tmp_path / "all.csv"), "test_fraction": 0.25}
    data = build_data(spec, seed=1)
    train, test = data.texts["train"], data.texts["test"]
    assert (len(train), len(test)) == (15, 5)
    assert sorted(train.texts + test.texts) == sorted(r["text"] for r in rows)
    assert data.num_labels == 3
    assert build_data(spec, seed=1).texts["test"] == test
    assert build_data(spec, seed=2).texts["test"] != test


def test_custom_columns_and_split_names(tmp_path):
    rows = [{"review": r["text"], "stars": r["label"]} for r in TRAIN_ROWS]
    write_rows(tmp_path / "fit.json", rows, "json")
    write_rows(tmp_path / "holdout.json", rows[:2], "json")
    spec = {"dataset": "json", "path": str(tmp_path), "text_column": "review", "label_column": "stars",
            "train_split": "fit", "test_split": "holdout"}
    data = build_data(spec)
    assert data.texts["train"].texts == [r["text"] for r in TRAIN_ROWS]
    assert data.texts["test"].labels == [1, 0]


@pytest.mark.parametrize("column,field", [("text", "text_column"), ("label", "label_column")])
def test_missing_column_names_it_and_lists_the_columns(tmp_path, column, field):
    rows = [{k: v for k, v in r.items() if k != column} | {"other": 1} for r in TRAIN_ROWS]
    write_rows(tmp_path / "train.csv", rows, "csv")
    write_rows(tmp_path / "test.csv", rows, "csv")
    with pytest.raises(UserError, match=rf"train.csv: no column '{column}' \(data.{field}\); its columns are: .*other"):
        build_data({"dataset": "csv", "path": str(tmp_path)})


def test_a_row_without_the_label_and_a_non_integer_label(tmp_path):
    write_rows(tmp_path / "a.jsonl", [{"text": "x", "label": 1}, {"text": "y"}], "jsonl")
    with pytest.raises(UserError, match=r"a.jsonl, row 2: needs the columns 'text' and 'label'"):
        build_data({"dataset": "json", "path": str(tmp_path / "a.jsonl")})
    write_rows(tmp_path / "b.json", [{"text": "x", "label": "positive"}, {"text": "y", "label": 0}], "json")
    with pytest.raises(UserError, match=r"b.json, row 1: label column 'label' holds 'positive'; labels must be integers"):
        build_data({"dataset": "json", "path": str(tmp_path / "b.json")})


def test_label_outside_num_labels_and_negative_labels(tmp_path):
    train = TextSplit(["a", "b", "c"], [0, 1, 2])
    test = TextSplit(["a"], [0])
    tok = train_wordpiece(train.texts)
    with pytest.raises(UserError, match=r"train split, row 3: label 2 is outside num_labels = 2 \(allowed: 0..1\)"):
        DataModule(train, test, tok, 8, num_labels=2)
    with pytest.raises(UserError, match=r"test split, row 1: label -1 is outside the allowed labels"):
        DataModule(test, TextSplit(["a"], [-1]), tok, 8)


def test_missing_path_bad_extension_and_directory_without_split_files(tmp_path):
    with pytest.raises(UserError, match=r"data.path = '.*nope.csv' does not exist"):
        build_data({"dataset": "csv", "path": str(tmp_path / "nope.csv")})
    (tmp_path / "rows.txt").write_text("x")
    with pytest.raises(UserError, match=r"dataset 'csv' reads files ending in .csv"):
        build_data({"dataset": "csv", "path": str(tmp_path / "rows.txt")})
    with pytest.raises(UserError, match=r"a directory must hold train.json or train.jsonl; it holds rows.txt"):
        build_data({"dataset": "json", "path": str(tmp_path)})


def test_spec_rules_on_path():
    with pytest.raises(ValidationError, match="dataset 'json' needs 'path'"):
        DataSpec(dataset="json")
    with pytest.raises(ValidationError, match="'path' is only for the local datasets csv, image-folder, json, npz, txt, not 'synthetic-sentiment'"):
        DataSpec(dataset="synthetic-sentiment", path="x.csv")
    with pytest.raises(ValidationError, match="'path' is only for the local datasets .*, not the task's synthetic dataset"):
        DataSpec(path="x.csv")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        DataSpec(rows=3)


def test_synthetic_defaults_sizes_and_max_length():
    spec = DataSpec()
    assert (spec.dataset, spec.resolved_dataset(), spec.resolved_max_length()) == (None, "synthetic-sentiment", 32)
    assert DataSpec(dataset="imdb").resolved_max_length() == 128
    data = build_data({"n_train": 50, "n_test": 20, "max_length": 10}, seed=0)
    assert (data.size("train"), data.size("test")) == (50, 20)
    batch = data.example_batch()
    assert batch["input_ids"].shape == (2, 10) and batch["labels"].tolist() == data.texts["train"].labels[:2]
    assert (batch["input_ids"][:, 0] == data.tokenizer.cls_token_id).all()


def test_the_default_language_model_corpus_keeps_a_prompts_common_words_whole():
    """A prompt such as the deploy guide's "the small dog" is words of the default causal-LM tokenizer, not letters."""
    data = build_data({"n_train": 64, "n_test": 8}, task="causal-lm", seed=0)
    assert data.tokenizer.tokenize("the small dog runs.") == ["the", "small", "dog", "runs", "."]


def test_loader_covers_every_row_once_and_is_seeded():
    tensors = {"labels": torch.arange(33)}
    loader = BatchLoader(tensors, batch_size=16, shuffle=False, seed=0)
    assert [len(b["labels"]) for b in loader] == [16, 16, 1] and len(loader) == 3
    assert [len(b["labels"]) for b in BatchLoader({"labels": torch.arange(34)}, 16, False, 0)] == [16, 16, 2]
    assert [len(b["labels"]) for b in BatchLoader({"labels": torch.arange(1)}, 16, False, 0)] == [1]
    first = torch.cat([b["labels"] for b in BatchLoader(tensors, 5, True, 7)])
    again = torch.cat([b["labels"] for b in BatchLoader(tensors, 5, True, 7)])
    other = torch.cat([b["labels"] for b in BatchLoader(tensors, 5, True, 8)])
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert sorted(first.tolist()) == list(range(33))
    with pytest.raises(UserError, match="batch_size must be a positive integer, got 0"):
        BatchLoader(tensors, 0, False, 0)


def test_unknown_split_is_an_error():
    data = build_data({"n_train": 8, "n_test": 4})
    with pytest.raises(UserError, match="split must be one of: train, test; got 'validation'"):
        data.loader("validation", 4)


def test_persist_writes_the_tokenizer_and_the_cache_that_the_next_build_reuses(tmp_path, monkeypatch):
    spec = {"n_train": 30, "n_test": 10, "max_length": 12}
    first = build_data(spec, seed=0, run_dir=tmp_path)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    first.persist(tmp_path)
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()
    assert [p.name for p in (tmp_path / "data_cache").iterdir()] == [f"{first.fingerprint}.safetensors"]

    tokenize = DataModule._tokenize

    def spot_checks_only(self, split):  # the entry is checked on a few rows, never tokenized whole
        assert len(split) <= 4, "the cache was not used"
        return tokenize(self, split)

    monkeypatch.setattr(DataModule, "_tokenize", spot_checks_only)
    second = build_data(spec, seed=0, run_dir=tmp_path)
    for split in ("train", "test"):
        for key in ("input_ids", "attention_mask", "labels"):
            assert torch.equal(first.tensors[split][key], second.tensors[split][key])


def test_with_tokenizer_retokenizes_the_same_rows():
    data = build_data({"n_train": 30, "n_test": 10, "max_length": 12})
    other = train_wordpiece(["an unrelated corpus"], vocab_size=50)
    moved = data.with_tokenizer(other)
    assert moved.texts == data.texts and moved.tokenizer is other
    assert torch.equal(moved.tensors["test"]["input_ids"], other(data.texts["test"].texts, padding="max_length",
                                                                  max_length=12, truncation=True,
                                                                  return_tensors="pt")["input_ids"])


def test_hub_dataset_offline_is_one_clear_error_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run_dir = tmp_path / "run"
    for name in ("imdb", "no-such-user/no-such-dataset"):
        with pytest.raises(UserError, match=rf"data.dataset = '{name}': the Hugging Face hub .* is unreachable"):
            build_data({"dataset": name}, run_dir=run_dir)
    assert not run_dir.exists()


def test_hub_probe_failure_switches_to_offline_without_waiting(tmp_path, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(UserError, match=r"data.dataset = 'imdb': the Hugging Face hub \(https://huggingface.co\) is unreachable"):
        build_data({"dataset": "imdb", "cache_dir": str(tmp_path / "cache")})



def test_datasets_library_path_reads_splits_and_caches_under_the_run(tmp_path):
    folder = tmp_path / "reviews"
    folder.mkdir()
    write_rows(folder / "train.csv", TRAIN_ROWS[:3], "csv")
    write_rows(folder / "test.csv", TEST_ROWS, "csv")
    run_dir = tmp_path / "run"
    data = build_data({"dataset": str(folder), "max_length": 12}, run_dir=run_dir)
    assert data.texts["train"].texts == [r["text"] for r in TRAIN_ROWS[:3]]
    assert data.texts["test"].labels == [1, 0, 0]
    assert (run_dir / "hf_cache").is_dir()
    with pytest.raises(UserError, match=r"data.test_split = 'validation': dataset '.*reviews' has the splits train, test"):
        build_data({"dataset": str(folder), "test_split": "validation"}, run_dir=run_dir)
    with pytest.raises(UserError, match=r"split 'train': no column 'review' \(data.text_column\); its columns are: text, label"):
        build_data({"dataset": str(folder), "text_column": "review"}, run_dir=run_dir)


def _tamper(path, change):
    """Change an entry as a planter would, its digest written anew: what the content checks must catch."""
    from safetensors.torch import load_file, save_file

    from mase_lite.workloads.splits import _tensors_digest

    flat = load_file(str(path))
    change(flat)
    save_file(flat, str(path), metadata={"format": "pt", "digest": _tensors_digest(flat)})


def test_bytes_of_a_cache_entry_changed_since_it_was_written_are_seen(tmp_path, caplog):
    """A byte of a row no content check samples (found by benchmarks/robustness.py: token ids past the vocabulary
    ended in an IndexError, other bytes silently changed the loss)."""
    spec = {"n_train": 30, "n_test": 10, "max_length": 12}
    first = build_data(spec, seed=0, run_dir=tmp_path)
    first.persist(tmp_path)
    [entry] = (tmp_path / "data_cache").iterdir()
    data = bytearray(entry.read_bytes())
    data[-9] ^= 0x40  # inside the last tensor's bytes, past its first rows
    entry.write_bytes(bytes(data))
    second = build_data(spec, seed=0, run_dir=tmp_path)
    assert "its tensors are not the bytes written (digest); tokenizing again" in caplog.text
    assert not entry.exists()
    for split in ("train", "test"):
        for key, tensor in first.tensors[split].items():
            assert torch.equal(second.tensors[split][key], tensor)


@pytest.mark.parametrize("task, spec, change, message", [
    ("sequence-classification", {"n_train": 30, "n_test": 10, "max_length": 12},
     lambda f: f.__setitem__("test.labels", 1 - f["test.labels"]), "its test labels are not the data's"),
    ("sequence-classification", {"n_train": 30, "n_test": 10, "max_length": 12},
     lambda f: f["train.input_ids"][0].fill_(3), r"train: input_ids differs from its data at rows \[0, "),
    ("sequence-classification", {"n_train": 30, "n_test": 10, "max_length": 12},
     lambda f: f.__setitem__("train.attention_mask", f["train.attention_mask"].float()), "is a torch.float32 tensor"),
    ("causal-lm", {"n_train": 8, "n_test": 4, "block_size": 16},
     lambda f: f["train.input_ids"][0, 3].fill_(5), "its train labels or token ids are not"),
    ("causal-lm", {"n_train": 8, "n_test": 4, "block_size": 16},
     lambda f: (f["test.input_ids"][0].fill_(5), f["test.labels"][0].fill_(5)), r"test: input_ids differs from its data"),
    ("seq2seq-lm", {"n_train": 8, "n_test": 4},
     lambda f: f["test.labels"][-1].fill_(4), r"test: labels differs from its data at rows"),
])
def test_a_planted_or_damaged_cache_entry_is_discarded_and_the_data_tokenized_again(task, spec, change, message,
                                                                                     tmp_path, caplog):
    """An entry is data: checked against what it claims (labels, shapes, a few rows tokenized again); one that
    fails is removed with a warning naming the problem, and the run uses its data tokenized afresh."""
    first = build_data(spec, task=task, seed=0, run_dir=tmp_path)
    first.persist(tmp_path)
    [entry] = (tmp_path / "data_cache").iterdir()
    _tamper(entry, change)
    second = build_data(spec, task=task, seed=0, run_dir=tmp_path)
    assert re.search(message, caplog.text), caplog.text
    assert not entry.exists()
    for split in ("train", "test"):
        for key, tensor in first.tensors[split].items():
            assert torch.equal(second.tensors[split][key], tensor)
