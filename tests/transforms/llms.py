"""The small decoder and the token batches the LLM compression tests (GPTQ, SparseGPT/Wanda, AWQ, outliers)
calibrate and evaluate on."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama() -> LlamaForCausalLM:
    """A 2-layer Llama (hidden 64, 4 heads, 2 KV heads, FFN 128, vocabulary 50), seeded, in eval mode."""
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=50)
    return LlamaForCausalLM(config).eval()


class TokenBatches:
    """Four seeded batches of 4 × 16 token ids (with ``labels`` unless told not), for every split and size."""

    seed = 0

    def __init__(self, vocab: int = 50, labels: bool = True):
        g = torch.Generator().manual_seed(0)
        self.batches = []
        for _ in range(4):
            ids = torch.randint(0, vocab, (4, 16), generator=g)
            self.batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), **({"labels": ids} if labels else {})})

    def loader(self, split, batch_size, shuffle=False, seed=0):
        return self.batches
