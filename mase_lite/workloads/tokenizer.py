"""Tokenizers: a WordPiece one trained on the data in milliseconds, or one loaded from disk or the hub.

Every tokenizer is a ``transformers`` fast tokenizer, so it pads, truncates and saves the same way
whatever its origin.

Example::

    tok = train_wordpiece(["the movie was great.", "the plot was dull."], vocab_size=500)
    tok.save_pretrained("runs/x/tokenizer")
    tok = load_tokenizer("runs/x/tokenizer")
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from mase_lite.infra.errors import UserError
from mase_lite.workloads.hub import hub_access
from mase_lite.infra.trust import TRUST_HINT, trusted

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MODEL_INPUTS = ["input_ids", "attention_mask"]


def _bert_pipeline(tok: Tokenizer) -> Tokenizer:
    """Lower-casing BERT normalizer and pre-tokenizer, WordPiece decoder."""
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


def build_vocabulary(texts: Iterable[str], vocab_size: int) -> dict[str, int]:
    """Special tokens, then every character (alone and as ``##c``), then the most frequent words.

    Ties in frequency are broken alphabetically, so the same texts always give the same ids
    (the ``tokenizers`` WordPiece trainer breaks ties differently from run to run).
    """
    splitter = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")))
    counts: Counter[str] = Counter()
    for text in texts:
        normalized = splitter.normalizer.normalize_str(text)
        counts.update(word for word, _ in splitter.pre_tokenizer.pre_tokenize_str(normalized))
    chars = sorted({c for word in counts for c in word})
    pieces = list(SPECIAL_TOKENS) + chars + [f"##{c}" for c in chars]
    if vocab_size < len(pieces):
        raise UserError(
            f"data.vocab_size = {vocab_size} is too small: the special tokens and the {len(chars)} characters "
            f"of the training texts need {len(pieces)} entries"
        )
    known = set(pieces)
    words = sorted((w for w in counts if w not in known), key=lambda w: (-counts[w], w))
    pieces += words[: vocab_size - len(pieces)]
    return {piece: i for i, piece in enumerate(pieces)}


def train_wordpiece(texts: Iterable[str], vocab_size: int = 2000) -> PreTrainedTokenizerFast:
    """A lower-casing BERT-style WordPiece tokenizer for ``texts``; ``[PAD]`` has id 0.

    Words outside the vocabulary split into known pieces (at worst characters), never ``[UNK]``
    unless a character was never seen.
    """
    vocab = build_vocabulary(texts, vocab_size)
    tok = _bert_pipeline(Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100)))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, vocab[t]) for t in ("[CLS]", "[SEP]")],
    )
    logger.info("built a WordPiece vocabulary of %d tokens", len(vocab))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        bos_token="[CLS]",  # a language model's documents end with [SEP]; a seq2seq decoder may start at [CLS]
        eos_token="[SEP]",
        model_input_names=MODEL_INPUTS,
    )


def load_tokenizer(
    name_or_dir: str | Path, cache_dir: Path | None = None, field: str = "data.tokenizer"
) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a directory (a run's, a checkpoint's or its ``tokenizer/``) or named on the hub.

    ``field`` names the spec entry that asked for it in error messages.
    """
    source = Path(name_or_dir)
    if source.is_dir() and not (source / "tokenizer.json").is_file() and (source / "tokenizer").is_dir():
        source = source / "tokenizer"
    online = True
    try:
        if source.is_dir():
            tokenizer = AutoTokenizer.from_pretrained(str(source), trust_remote_code=trusted())
        else:
            with hub_access() as online:
                tokenizer = AutoTokenizer.from_pretrained(str(name_or_dir), cache_dir=cache_dir, trust_remote_code=trusted())
    except Exception as err:  # a directory's files are data: whatever they hold is refused, never a traceback
        expected = isinstance(err, (OSError, ValueError))
        if not (expected or source.is_dir()):
            raise
        reason = (str(err).splitlines() or [""])[0]
        reason = reason if expected and reason else f"{err.__class__.__name__}: {reason}"
        hint = "the hub is unreachable: give a local directory" if not online else "give a directory holding tokenizer.json or a hub name"
        if "trust_remote_code" in str(err):
            reason, hint = "it names custom code, which is not run", TRUST_HINT
        raise UserError(f"{field} = {str(name_or_dir)!r}: could not load its tokenizer ({reason}); {hint}") from None
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserError(f"{field} = {str(name_or_dir)!r}: its tokenizer has neither a padding nor an end-of-text token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def same_vocabulary(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """Whether two tokenizers map every token to the same id."""
    return a.get_vocab() == b.get_vocab()
