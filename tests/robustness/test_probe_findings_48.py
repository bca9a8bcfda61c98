"""Issue 48, items 7 and 9: what the reliability probe still found, each reproduced as it was found (tracebacks,
a hang, reads of any size), now refused in one line naming the field, or handled. The planted cache entries of
items 9a and 9b are tested beside their caches' other entries (tests/ir/test_export_cache.py,
tests/search/test_durability.py)."""

import copy
import io
import json
import os
import zipfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite.infra import limits
from mase_lite.cli import main
from mase_lite.infra.errors import UserError
from mase_lite.runtime.generation import Sampling, next_token
from mase_lite.workloads.tokenizer import train_wordpiece
from tests.search.conftest import TINY_PIPELINE, search_spec

LLAMA = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64}
T5 = {"model_type": "t5", "d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 1, "num_heads": 2}


def run_cli(tmp_path, capsys, command: str, spec: dict) -> str:
    """``mase-lite <command> spec.json``: exit 2 and no traceback; what it printed on stderr."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip()


def sparse(path, size: int) -> None:
    """A file of ``size`` zero bytes that takes no room on disk."""
    with open(path, "wb") as f:
        f.truncate(size)


def llm_spec(tmp_path, task: str = "causal-lm", config: dict = LLAMA, data: dict | None = None, steps=()) -> dict:
    return {"model": {"task": task, "hf_config": config}, "output_dir": str(tmp_path / "run"), "steps": list(steps),
            "data": data or {"block_size": 16, "n_train": 16, "n_test": 8}}


# ------------------------------------------------------------------------------------------ item 7: generate


@pytest.fixture(scope="module")
def generating():
    """A tiny Llama and the run's data as the generate pass sees it (its tokenizer)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    return model.eval(), SimpleNamespace(tokenizer=train_wordpiece(["the cat sat on the mat .", "a dog ran ."], vocab_size=90))


def test_a_seed_torch_cannot_take_is_refused_naming_it(tmp_path, capsys):
    steps = [{"pass": "generate", "params": {"prompts": ["the dog"], "do_sample": True, "seed": 2**64}}]
    err = run_cli(tmp_path, capsys, "run", llm_spec(tmp_path, steps=steps))
    assert err.splitlines()[-1] == "steps.0.params.seed: Input should be less than 18446744073709551616 " \
                                   "(got 18446744073709551616)"


@pytest.mark.parametrize("name, params", [("prune", {"weight": {"method": "random", "sparsity": 0.5}}), ("lora", {}),
                                           ("outliers", {}), ("train", {"max_steps": 1}), ("generate", {})])
@pytest.mark.parametrize("seed", [2**64, -1])
def test_every_seeded_pass_refuses_a_seed_torch_cannot_take(name, params, seed):
    if name == "prune":
        params = {"weight": {**params["weight"], "seed": seed}}
    else:
        params = {**params, "seed": seed}
    with pytest.raises(UserError, match=rf"pass '{name}' params\.(weight\.)?seed: Input should be "):
        getattr(ml.passes, name)(torch.nn.Linear(2, 2), params)  # the params are checked first


@pytest.mark.parametrize("top_p", [1e-300, 1e-45, 1e-8])
def test_a_tiny_top_p_keeps_the_single_most_likely_token(top_p):
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    sampling = Sampling(do_sample=True, top_p=top_p)
    drawn = {next_token(logits, sampling, torch.Generator().manual_seed(seed)) for seed in range(20)}
    assert drawn == {int(logits.argmax())}


def test_a_tiny_temperature_samples_the_most_likely_token():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    assert next_token(logits, Sampling(do_sample=True, temperature=1e-300), torch.Generator()) == int(logits.argmax())


def test_an_encoder_decoder_samples_with_a_tiny_top_p_or_temperature(generating):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(vocab_size=96, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
                                                decoder_start_token_id=0)).eval()
    data = generating[1]
    greedy = ml.passes.generate(model, {"prompts": ["the dog"], "max_new_tokens": 4}, data=data)[1]
    for tiny in ({"top_p": 1e-300}, {"temperature": 1e-300}):
        params = {"prompts": ["the dog"], "max_new_tokens": 4, "do_sample": True, "seed": 2**64 - 1, **tiny}
        assert ml.passes.generate(model, params, data=data)[1]["completions"] == greedy["completions"], tiny


def test_top_p_still_keeps_the_smallest_set_reaching_its_mass():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    drawn = {next_token(logits, Sampling(do_sample=True, top_p=0.5), torch.Generator().manual_seed(s)) for s in range(200)}
    assert drawn == {0, 1}


def test_an_empty_prompt_is_refused_naming_it(generating):
    model, data = generating
    with pytest.raises(UserError, match=r"^pass 'generate' params\.prompts\.1: a prompt needs text to complete \(got ' '\)$"):
        ml.passes.generate(model, {"prompts": ["the dog", " "]}, data=data)
    with pytest.raises(UserError, match=r"^pass 'generate' params\.prompts\.0: the prompt '\\x00' encodes to no tokens"):
        ml.passes.generate(model, {"prompts": ["\x00"]}, data=data)


def test_a_prompts_file_that_is_a_fifo_is_refused_not_waited_on(generating, tmp_path):
    model, data = generating
    os.mkfifo(tmp_path / "prompts")
    with pytest.raises(UserError, match=r"^pass 'generate' params\.prompts_file: .*prompts: not a regular file; a prompts "
                                        r"file is one$"):
        ml.passes.generate(model, {"prompts_file": str(tmp_path / "prompts")}, data=data)


def test_a_prompts_file_beyond_memory_is_refused_unread(generating, tmp_path, monkeypatch):
    """/dev/zero's case (5.5 GB read, then MemoryError): a sparse file larger than the bound."""
    model, data = generating
    monkeypatch.setattr(limits, "memory_bytes", lambda: 1 << 30)
    sparse(tmp_path / "prompts.txt", 2 << 30)
    with pytest.raises(UserError, match=r"^pass 'generate' params\.prompts_file: .*prompts\.txt: reading a prompts file "
                                        r"of 2147483648 bytes would need about 21\.5 GB, more than the 1\.1 GB"):
        ml.passes.generate(model, {"prompts_file": str(tmp_path / "prompts.txt")}, data=data)


def test_a_line_of_the_prompts_file_without_tokens_is_blamed_on_the_file(generating, tmp_path):
    model, data = generating
    (tmp_path / "prompts.txt").write_text("the dog\n\n\x00\n")
    with pytest.raises(UserError, match=r"^pass 'generate' params\.prompts_file: the prompt '\\x00' encodes to no tokens"):
        ml.passes.generate(model, {"prompts": ["a cat"], "prompts_file": str(tmp_path / "prompts.txt")}, data=data)


# ------------------------------------------------------------------------------- item 9b: the signing key


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "mase_lite" / "signing.key"


def test_the_key_is_made_once_for_this_user_alone(state):
    from mase_lite.infra.signing import user_key

    key = user_key()
    assert len(key) == 32 and state.read_bytes() == key and user_key() == key
    assert state.stat().st_mode & 0o777 == 0o600 and state.parent.stat().st_mode & 0o077 == 0
    assert [p.name for p in state.parent.iterdir()] == ["signing.key"]  # no temporary file left


@pytest.mark.parametrize("exposure", ["a link", "readable by others", "writable by others", "not a key"])
def test_a_key_others_could_know_or_set_is_replaced(state, tmp_path, exposure, caplog):
    from mase_lite.infra.signing import user_key

    old = user_key()
    if exposure == "a link":
        (tmp_path / "chosen").write_bytes(b"k" * 32)
        os.chmod(tmp_path / "chosen", 0o600)
        state.unlink()
        state.symlink_to(tmp_path / "chosen")
    elif exposure == "not a key":
        state.write_bytes(b"short")
    else:
        os.chmod(state, 0o644 if exposure == "readable by others" else 0o622)
    with caplog.at_level("WARNING", logger="mase_lite.infra.signing"):
        new = user_key()
    assert "a new key replaces it" in caplog.text
    assert new not in (old, b"k" * 32) and state.read_bytes() == new and not state.is_symlink()
    assert state.stat().st_mode & 0o777 == 0o600 and user_key() == new
    if exposure == "a link":
        assert (tmp_path / "chosen").read_bytes() == b"k" * 32  # what the link pointed at is left alone


# ---------------------------------------------------------------------------------------- item 9c: .npz


def _npz_declaring(path, members: dict) -> None:
    """An .npz of small members; a tuple stands for an .npy header declaring that shape of float64 (no data)."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            if isinstance(content, tuple):
                header = io.BytesIO()
                np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": content})
                content = header.getvalue()
            archive.writestr(name, content)


@pytest.mark.parametrize("members, memory", [
    ({"notes.txt": b"not an array", "images.npy": (10**6, 10**6), "labels.npy": (4,)}, None),  # was counted as 0
    ({"images.npy": (1000, 1000, 1000), "labels.npy": (1000,)}, 4 << 30),  # an 8 GB member, 4 GB of memory
])
def test_an_npz_member_declaring_more_than_memory_is_refused_before_loading(tmp_path, monkeypatch, members, memory):
    from mase_lite.workloads.data import build_data

    if memory is not None:
        monkeypatch.setattr(limits, "memory_bytes", lambda: memory)
    _npz_declaring(tmp_path / "x.npz", members)
    with pytest.raises(UserError, match=r"^data\.path: the arrays of .*x\.npz would need about [\d.]+ GB, more than"):
        build_data({"dataset": "npz", "path": str(tmp_path / "x.npz")}, task="image-classification")


# --------------------------------------------------------------------------------- item 9d: fuzzed specs


@pytest.mark.parametrize("value", [-2**63, 10**6, [1, -1], "1"])
def test_a_token_id_outside_the_vocabulary_is_refused_naming_it(value, tmp_path):
    from mase_lite.workloads.prepare import prepare

    spec = {"task": "seq2seq-lm", "hf_config": {**T5, "decoder_start_token_id": value}}
    with pytest.raises(UserError, match=r"^model\.hf_config\.decoder_start_token_id = .*: a token id is an integer "
                                        r"0 \.\. \d+ \(vocab_size \d+\), or null$"):
        prepare(spec, {"n_train": 8, "n_test": 4, "max_length": 8}, tmp_path, seed=0)


def test_a_token_id_outside_the_vocabulary_exits_2_from_the_cli(tmp_path, capsys):
    spec = llm_spec(tmp_path, "seq2seq-lm", {**T5, "decoder_start_token_id": -2**63}, {"n_train": 8, "n_test": 4, "max_length": 8})
    err = run_cli(tmp_path, capsys, "run", spec)
    assert err.startswith("mase-lite: error: model.hf_config.decoder_start_token_id = -9223372036854775808: a token id")


def test_a_length_whose_attention_exceeds_memory_is_refused_naming_it(tmp_path):
    """T5's positions are relative (no max_position_embeddings): 10^5 tokens took a 40 GB allocation to fail."""
    from mase_lite.workloads.prepare import prepare

    with pytest.raises(UserError, match=r"^data\.max_length: the attention of one sequence of 100000 tokens \(2 heads\) "
                                        r"would need about 320\.0 GB, more than"):
        prepare({"task": "seq2seq-lm", "hf_config": T5}, {"n_train": 4, "n_test": 2, "max_length": 10**5}, tmp_path, seed=0)


def test_training_counts_the_gradients_and_adams_two_moments(monkeypatch):
    """The vocabulary-sized case: 64 MB of weights fit in 100 MB of memory; their gradients and AdamW's two moments
    (192 MB more) do not."""
    from mase_lite.workloads.batches import GivenBatches
    from mase_lite.workloads.trainer import fit

    monkeypatch.setattr(limits, "memory_bytes", lambda: 100 << 20)
    model = torch.nn.Embedding(10**6, 16)
    with pytest.raises(UserError, match=r"^freeze: training 16000000 parameters \(a gradient and AdamW's two moments for "
                                        r"each\) would need about 0\.2 GB, more than the 0\.1 GB"):
        fit(model, GivenBatches([{"input_ids": torch.zeros(1, 2, dtype=torch.long)}]))


# ------------------------------------------------------------------------------------ item 9e: a text corpus


def test_a_text_corpus_beyond_memory_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """A 2 GB one-line .txt (sparse here) with 1 GB of memory."""
    from mase_lite.workloads.data import build_data

    monkeypatch.setattr(limits, "memory_bytes", lambda: 1 << 30)
    sparse(tmp_path / "corpus.txt", 2 << 30)
    with pytest.raises(UserError, match=r"^.*corpus\.txt: reading a txt file of 2147483648 bytes would need about 21\.5 GB"):
        build_data({"dataset": "txt", "path": str(tmp_path / "corpus.txt")}, task="causal-lm")


# ---------------------------------------------------------------------------------- item 9f: a search spec


def test_step_params_given_as_a_list_are_refused_naming_them(tmp_path, capsys):
    pipeline = copy.deepcopy(TINY_PIPELINE)
    pipeline["steps"][1]["params"] = [8, 4]
    err = run_cli(tmp_path, capsys, "search", search_spec(tmp_path, pipeline=pipeline))
    assert err == "mase-lite: error: pipeline: steps.1.params: a list, where the space sets " \
                  "steps.1.params.rules.linear.weight_width (an object of fields)"
