"""The course's first transform pass: remove every dropout node, rewiring its users to its input.

A transform changes the graph in place and returns what it did; the pass manager then lints the
graph, regenerates its code and refreshes its metadata, once — the pass makes none of those calls.

Run: python examples/remove_dropout.py
"""

import mase_lite as ml
from mase_lite.passes import PassResult, register_pass
from transformers import BertConfig, BertForSequenceClassification


@register_pass("remove_dropout_example", kind="transform")
def remove_dropout_example(mg, params):
    """Bypass and erase each dropout node."""
    removed = []
    for node in mg.nodes:
        if node.meta["mase"]["op"] == "dropout":
            node.replace_all_uses_with(node.args[0])
            mg.erase_node(node)
            removed.append(node.name)
    return PassResult({"removed": removed})


if __name__ == "__main__":
    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
    mg = ml.MaseGraph(BertForSequenceClassification(config), hf_input_names=["input_ids", "attention_mask", "labels"])
    mg, info = ml.passes.remove_dropout_example(mg)
    left = sum(n.meta["mase"]["op"] == "dropout" for n in mg.nodes)
    print(f"removed {len(info['removed'])} dropout nodes; {left} left")
