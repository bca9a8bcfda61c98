import os

import pytest
import torch

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/mase_lite_inductor_cache")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _isolated_trust():
    """What one test named as trusted (a spec's factory, a --plugin, --trust-code) does not leak into the next."""
    from mase_lite import trust

    flag, named, plugins = list(trust._trust), set(trust._named), set(trust._plugin_modules)
    yield
    trust._trust[:] = flag
    trust._named.clear()
    trust._named.update(named)
    trust._plugin_modules.clear()
    trust._plugin_modules.update(plugins)


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
