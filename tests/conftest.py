import os

import pytest
import torch

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/mase_lite_inductor_cache")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def tiny_bert_config(**overrides):
    from transformers import BertConfig

    kwargs = dict(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, vocab_size=1000
    )
    kwargs.update(overrides)
    return BertConfig(**kwargs)


@pytest.fixture
def tiny_bert():
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(tiny_bert_config()).eval()
