"""The built-in tasks: text classification, causal and sequence-to-sequence language models, image
classification. A plug-in adds one the same way, with ``register_task``."""

from __future__ import annotations

from mase_lite.workloads.data import classification_data, image_data, language_data, seq2seq_data
from mase_lite.workloads.tasks import Task, register_task

_TEXT = ("vocab_size", "tokenizer")
_TOKEN_METRICS = ("loss", "perplexity", "accuracy", "tokens", "n")

register_task(Task(
    "sequence-classification", "AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    ("input_ids", "attention_mask", "labels"), per_token=False, default_dataset="synthetic-sentiment",
    default_hf_config={"model_type": "bert", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "intermediate_size": 512, "max_position_embeddings": 512},
    build_data=classification_data, metrics=("accuracy", "loss", "n", "per_class.*"),
    data_fields=("text_column", "label_column", "max_length", *_TEXT), classification=True))

register_task(Task(
    "causal-lm", "AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    ("input_ids", "attention_mask", "labels"), per_token=True, default_dataset="synthetic-grammar",
    default_hf_config={"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "intermediate_size": 344, "max_position_embeddings": 512},
    build_data=language_data,
    metrics=(*_TOKEN_METRICS, "perplexity_bound", "perplexity_entropy_rate"),  # the bound: a grammar corpus's
    data_fields=("text_column", "block_size", "stride", *_TEXT), shift=True))

register_task(Task(
    "image-classification", "AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    ("pixel_values", "labels"), per_token=False, default_dataset="synthetic-shapes",
    default_hf_config={"model_type": "resnet", "embedding_size": 16, "hidden_sizes": [16, 32, 64], "depths": [1, 1, 1],
                       "layer_type": "basic", "downsample_in_first_stage": False},
    build_data=image_data, metrics=("accuracy", "loss", "n", "per_class.*", "top5"),
    data_fields=("label_column", "image_column", "image_size"), classification=True, top5=True))

register_task(Task(
    "seq2seq-lm", "AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    ("input_ids", "attention_mask", "labels"), per_token=True, default_dataset="synthetic-reversal",
    default_hf_config={"model_type": "t5", "d_model": 64, "d_kv": 32, "d_ff": 128, "num_layers": 2, "num_heads": 2},
    build_data=seq2seq_data, metrics=_TOKEN_METRICS,
    data_fields=("source_column", "target_column", "max_length", "max_target_length", *_TEXT)))
