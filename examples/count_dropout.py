"""The course's first analysis pass: count the dropout nodes of a captured BERT.

Run: python examples/count_dropout.py
"""

import mase_lite as ml
from mase_lite.passes import PassResult, register_pass
from transformers import BertConfig, BertForSequenceClassification


@register_pass("count_dropout", kind="analysis", metrics=("count",))
def count_dropout(mg, params):
    """Count dropout nodes and list their names; the count is a metric (``count_dropout.count`` in a run's
    report, and an objective a search can use)."""
    names = [n.name for n in mg.nodes if n.meta["mase"]["op"] == "dropout"]
    return PassResult({"nodes": names}, metrics={"count": len(names)})


if __name__ == "__main__":
    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
    mg = ml.MaseGraph(BertForSequenceClassification(config), hf_input_names=["input_ids", "attention_mask", "labels"])
    mg, info = ml.passes.count_dropout(mg)
    print(f"{info['metrics']['count']} dropout nodes: {', '.join(info['nodes'])}")
