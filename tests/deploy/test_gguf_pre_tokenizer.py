"""A byte-level GGUF vocabulary is cut into words as llama.cpp cuts it for the file's ``tokenizer.ggml.pre``: digits
one by one (SmolLM, StarCoder), in threes (Llama 3), or with the letters (GPT-2, and any other ``pre``). On a real model
(SmolLM2-135M-Instruct's GGUF) the tool's tokens of a 120 KB text equal llama.cpp's llama-tokenize's, all 28,891
(benchmarks/RESULTS.md)."""

import gguf
import pytest

from mase_lite.importers.gguf import read_tokenizer

WORDS = {  # pre: how "ab 12345" is cut (byte-level: Ġ is the space)
    "gpt-2": ["ab", "Ġ12345"],
    "smollm": ["ab", "Ġ", "1", "2", "3", "4", "5"],
    "starcoder": ["ab", "Ġ", "1", "2", "3", "4", "5"],
    "llama-bpe": ["ab", "Ġ", "123", "45"],
    "qwen2": ["ab", "Ġ", "1", "2", "3", "4", "5"],
    "some-new-model": ["ab", "Ġ12345"],
}


def vocabulary_file(path, pre: str) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    tokens = ["a", "b", "ab", "Ġ", "1", "2", "3", "4", "5", "12", "123", "45"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(["a b", "1 2", "12 3", "4 5"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("pre", list(WORDS))
def test_words_are_cut_as_llama_cpp_cuts_them(pre, tmp_path):
    vocabulary_file(tmp_path / "v.gguf", pre)
    tokenizer = read_tokenizer(tmp_path / "v.gguf")
    assert [w for w, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str("ab 12345")] == WORDS[pre]
    expected = {"gpt-2": None, "some-new-model": None, "llama-bpe": ["ab", "Ġ", "123", "45"]}.get(pre, WORDS[pre])
    if expected is not None:  # each word a token of the vocabulary
        assert tokenizer.convert_ids_to_tokens(tokenizer("ab 12345", add_special_tokens=False)["input_ids"]) == expected
