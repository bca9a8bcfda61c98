import pytest

from mase_lite.infra.errors import UserError
from mase_lite.workloads.tokenizer import build_vocabulary, load_tokenizer, same_vocabulary, train_wordpiece


def test_vocabulary_exact_specials_then_characters_then_words_by_frequency():
    vocab = build_vocabulary(["bb a", "cc cc", "Bb"], vocab_size=100)
    assert list(vocab) == [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "##a", "##b", "##c", "bb", "cc",
    ]
    assert list(vocab.values()) == list(range(13))


def test_frequency_ties_break_alphabetically_whatever_the_order_of_texts():
    texts = ["zeta alpha mid", "mid zeta alpha", "omega"]
    assert build_vocabulary(texts, 40) == build_vocabulary(list(reversed(texts)), 40)
    words = [w for w in build_vocabulary(texts, 40) if len(w) > 2 and not w.startswith(("[", "##"))]
    assert words == ["alpha", "mid", "zeta", "omega"]


def test_vocab_size_caps_the_words_kept():
    vocab = build_vocabulary(["aa aa bb"], vocab_size=10)
    assert list(vocab)[-1] == "aa" and len(vocab) == 10


def test_vocab_too_small_for_the_characters():
    with pytest.raises(UserError, match=r"data.vocab_size = 8 is too small: .* 2 characters .* need 9 entries"):
        build_vocabulary(["ab"], vocab_size=8)


def test_encoding_wraps_in_cls_sep_pads_with_id_zero_and_splits_unseen_words():
    tok = train_wordpiece(["the movie was great.", "the plot was dull."], vocab_size=200)
    enc = tok(["The MOVIE was great!"], padding="max_length", max_length=10, truncation=True)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
    assert tokens == ["[CLS]", "the", "movie", "was", "great", "[UNK]", "[SEP]", "[PAD]", "[PAD]", "[PAD]"]
    assert enc["attention_mask"][0] == [1] * 7 + [0] * 3
    assert tok.pad_token_id == 0
    assert "token_type_ids" not in enc
    assert tok.tokenize("dullest") == ["dull", "##e", "##s", "##t"]


def test_saved_tokenizer_loads_back_from_its_directory_or_the_parent(tmp_path):
    tok = train_wordpiece(["a small corpus of words"], vocab_size=100)
    tok.save_pretrained(str(tmp_path / "ckpt" / "tokenizer"))
    for where in (tmp_path / "ckpt" / "tokenizer", tmp_path / "ckpt"):
        loaded = load_tokenizer(where)
        assert same_vocabulary(loaded, tok)
        assert loaded("small words")["input_ids"] == tok("small words")["input_ids"]


def test_unknown_tokenizer_offline_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"data.tokenizer = 'no-such-user/no-such-model': could not load .*unreachable"):
        load_tokenizer("no-such-user/no-such-model")
