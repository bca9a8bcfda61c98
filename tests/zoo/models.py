"""The zoo: tiny-config transformers models of many families, plus hand-written nets.

Each entry builds a freshly initialised model (nothing is downloaded) and names the inputs it is
captured with. ``kind`` says how example batches are made: ``text`` (batch, seq) tokens,
``seq2seq`` text with decoder inputs, ``vision`` images, ``audio`` raw waveforms, ``plain`` a
hand-written net with its own ``make`` function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import transformers as tf

VOCAB = 99
TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
DECODER = dict(TEXT, num_key_value_heads=2, max_position_embeddings=128)


@dataclass
class Entry:
    name: str
    build: Callable[[], nn.Module]
    inputs: list[str]
    kind: str = "text"
    make: Callable[[int, int], dict[str, torch.Tensor]] | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def hf(cls: str, config: str, inputs: list[str], kind: str = "text", notes: str = "", **cfg) -> Entry:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return getattr(tf, cls)(getattr(tf, config)(**cfg)).eval()

    return Entry(cls, build, inputs, kind, notes=notes)


# ---- hand-written nets --------------------------------------------------------------------------


class DropPath(nn.Module):
    """Stochastic depth as timm writes it: identity in eval mode."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        if self.p == 0.0 or not self.training:
            return x
        keep = 1 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep


class ResidualDropPathNet(nn.Module):
    """Residual blocks with drop-path, a shared block called in a loop, and a lifted constant."""

    def __init__(self, dim: int = 16, depth: int = 3):
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.block = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.drop_path = DropPath(0.2)
        self.depth = depth
        self.head = Head(dim)

    def forward(self, x):
        h = self.inp(x)
        for _ in range(self.depth):  # one module, called in a loop
            h = h + self.drop_path(self.block(h))
        return self.head(h)


class Head(nn.Module):
    """Scales by a tensor made inside forward: export lifts it as ``head.lifted_tensor_0``."""

    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, 3)

    def forward(self, h):
        return self.fc(h) * torch.tensor([1.0, 2.0, 0.5])


class PositionEmbedding(nn.Embedding):
    """A leaf subclass with its own forward: it takes the mask, not indices (OPT's pattern)."""

    def forward(self, mask):
        positions = torch.cumsum(mask, dim=1) * mask - 1
        return super().forward(positions.clamp(min=0) + 2)


class MaskedTokenNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 16)
        self.pos = PositionEmbedding(64, 16)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(16, 4)

    def forward(self, input_ids, attention_mask):
        h = self.drop(self.tok(input_ids) + self.pos(attention_mask))
        return self.fc(h).mean(dim=1)


def _plain_tokens(batch: int, seq: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(batch * 100 + seq)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq // 2 :] = 0
    return {"input_ids": torch.randint(0, VOCAB, (batch, seq), generator=g), "attention_mask": mask}


def _plain_vectors(batch: int, seq: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(batch, seq, 8, generator=torch.Generator().manual_seed(batch * 100 + seq))}


def _seeded(cls):
    def build():
        torch.manual_seed(0)
        return cls().eval()

    return build


ZOO: list[Entry] = [
    # encoders
    hf("BertForSequenceClassification", "BertConfig", ["input_ids", "attention_mask", "token_type_ids", "labels"], **TEXT),
    hf("RobertaForMaskedLM", "RobertaConfig", ["input_ids", "attention_mask", "labels"], **TEXT),
    hf("DistilBertForSequenceClassification", "DistilBertConfig", ["input_ids", "attention_mask", "labels"],
       vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64),
    hf("AlbertForSequenceClassification", "AlbertConfig", ["input_ids", "attention_mask", "labels"], embedding_size=16, **TEXT),
    hf("ElectraForTokenClassification", "ElectraConfig", ["input_ids", "attention_mask", "labels"], embedding_size=16, **TEXT),
    hf("MobileBertForSequenceClassification", "MobileBertConfig", ["input_ids", "attention_mask", "labels"],
       vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
       embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=1),
    # decoders
    hf("GPT2LMHeadModel", "GPT2Config", ["input_ids", "attention_mask", "labels"], vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=128),
    hf("GPTNeoForCausalLM", "GPTNeoConfig", ["input_ids", "attention_mask", "labels"], vocab_size=VOCAB, hidden_size=32,
       num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]], window_size=8, max_position_embeddings=128,
       notes="lifted constants"),
    hf("OPTForCausalLM", "OPTConfig", ["input_ids", "attention_mask", "labels"], vocab_size=VOCAB, hidden_size=32,
       num_hidden_layers=2, num_attention_heads=2, ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=128,
       notes="Embedding subclass with its own forward"),
    hf("LlamaForCausalLM", "LlamaConfig", ["input_ids", "attention_mask", "labels"], **DECODER),
    hf("MistralForCausalLM", "MistralConfig", ["input_ids", "attention_mask", "labels"], **DECODER),
    hf("Qwen2ForCausalLM", "Qwen2Config", ["input_ids", "attention_mask", "labels"], **DECODER),
    hf("PhiForCausalLM", "PhiConfig", ["input_ids", "attention_mask", "labels"], **DECODER),
    hf("GemmaForCausalLM", "GemmaConfig", ["input_ids", "attention_mask", "labels"], head_dim=16, **DECODER),
    hf("BloomForCausalLM", "BloomConfig", ["input_ids", "attention_mask", "labels"], vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2),
    # encoder-decoders
    hf("T5ForConditionalGeneration", "T5Config", ["input_ids", "attention_mask", "decoder_input_ids", "labels"], "seq2seq",
       vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, notes="decoder keeps its own config"),
    hf("BartForConditionalGeneration", "BartConfig", ["input_ids", "attention_mask", "decoder_input_ids", "labels"], "seq2seq",
       vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
       encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128, encoder_layerdrop=0.1, decoder_layerdrop=0.1,
       notes="layerdrop"),
    # vision
    hf("ViTForImageClassification", "ViTConfig", ["pixel_values", "labels"], "vision", image_size=32, patch_size=8, num_labels=5, **TEXT),
    hf("DeiTForImageClassification", "DeiTConfig", ["pixel_values", "labels"], "vision", image_size=32, patch_size=8, **TEXT),
    hf("SwinForImageClassification", "SwinConfig", ["pixel_values", "labels"], "vision", image_size=32, patch_size=4,
       embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, drop_path_rate=0.1, notes="drop-path"),
    hf("ConvNextForImageClassification", "ConvNextConfig", ["pixel_values", "labels"], "vision", image_size=32,
       hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, drop_path_rate=0.1, notes="drop-path"),
    hf("ResNetForImageClassification", "ResNetConfig", ["pixel_values", "labels"], "vision", embedding_size=8,
       hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
    # speech
    hf("Wav2Vec2ForSequenceClassification", "Wav2Vec2Config", ["input_values", "labels"], "audio", hidden_size=32,
       num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(8, 8), conv_stride=(5, 2),
       conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, layerdrop=0.1, notes="layerdrop"),
    hf("HubertForSequenceClassification", "HubertConfig", ["input_values", "labels"], "audio", hidden_size=32,
       num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(8, 8), conv_stride=(5, 2),
       conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2),
    # hand-written
    Entry("ResidualDropPathNet", _seeded(ResidualDropPathNet), ["x"], "plain", _plain_vectors,
          notes="loop, shared module, drop-path, lifted constant"),
    Entry("MaskedTokenNet", _seeded(MaskedTokenNet), ["input_ids", "attention_mask"], "plain", _plain_tokens,
          notes="Embedding subclass with its own forward"),
]
