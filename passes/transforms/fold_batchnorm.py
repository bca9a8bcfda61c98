"""``fold_batchnorm``: fold an eval-mode BatchNorm into the Conv or Linear that feeds it.

For ``y = bn(conv(x))`` with running statistics, the conv becomes one with weight
``w * g / sqrt(var + eps)`` (per output channel) and bias ``(b - mean) * g / sqrt(var + eps) + beta``,
and the BatchNorm node leaves the graph. The folded graph equals the original in eval mode (in
train mode a BatchNorm would normalise with batch statistics instead). Linear + BatchNorm1d is
folded when the Linear's output is 2-D (features on dim 1). The BatchNorm modules stay in the
model tree, unused (``dead_code`` with ``delete_unused_modules`` deletes them). A folded layer keeps
its weight mask, activation pruning and quantization config (quantizers then see the folded weight).

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 4, 3), bn=nn.BatchNorm2d(4), act=nn.ReLU())).eval()
>>> x = torch.randn(2, 3, 8, 8)
>>> mg = ml.MaseGraph(model, example_inputs={"input": x})
>>> before = mg.model(input=x)
>>> mg, info = ml.passes.fold_batchnorm(mg)
>>> info["folded"], [n.name for n in mg.nodes]
([{'into': 'conv', 'batch_norm': 'bn'}], ['input_1', 'conv', 'act', 'output'])
>>> torch.allclose(mg.model(input=x), before, atol=1e-6)
True
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx
import torch.nn as nn

from mase_lite.layers.pruning import attach_weight_mask, share_activation_pruner, weight_mask_of
from mase_lite.layers.quantized import quantized_like
from mase_lite.passes.registry import NoParams, PassResult, register_pass

logger = logging.getLogger(__name__)

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _calls(graph: fx.Graph, target: str) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_module" and n.target == target)


def _foldable(node: fx.Node, modules: dict[str, nn.Module], graph: fx.Graph) -> bool:
    """Whether ``node`` is a BatchNorm with running stats fed only by a Conv/Linear called once."""
    if node.op != "call_module" or not isinstance(modules.get(node.target), nn.modules.batchnorm._BatchNorm):
        return False
    bn = modules[node.target]
    producer = node.args[0] if node.args else None
    if bn.running_mean is None or not isinstance(producer, fx.Node) or producer.op != "call_module":
        return False
    layer = modules.get(producer.target)
    if len(producer.users) != 1 or _calls(graph, producer.target) != 1 or _calls(graph, node.target) != 1:
        return False
    if isinstance(layer, _CONVS):
        return type(layer).__name__[-2:] == type(bn).__name__[-2:] and layer.out_channels == bn.num_features
    val = producer.meta.get("val")
    return (
        isinstance(layer, nn.Linear)
        and isinstance(bn, nn.BatchNorm1d)
        and layer.out_features == bn.num_features
        and val is not None
        and val.dim() == 2
    )


@torch.no_grad()
def folded_layer(layer: nn.Module, bn: nn.modules.batchnorm._BatchNorm) -> nn.Module:
    """A new Conv/Linear (with bias) computing ``bn(layer(x))`` with ``bn``'s running statistics."""
    weight = layer.weight
    wide = torch.promote_types(weight.dtype, torch.float64)
    inv_std = torch.rsqrt(bn.running_var.to(wide) + bn.eps)
    gamma = bn.weight.to(wide) if bn.weight is not None else torch.ones_like(inv_std)
    beta = bn.bias.to(wide) if bn.bias is not None else torch.zeros_like(inv_std)
    factor = gamma * inv_std
    bias = layer.bias.to(wide) if layer.bias is not None else torch.zeros_like(inv_std)
    factory = {"device": weight.device, "dtype": weight.dtype}
    if isinstance(layer, nn.Linear):
        new = nn.Linear(layer.in_features, layer.out_features, bias=True, **factory)
    else:
        conv_class = next(cls for cls in _CONVS if isinstance(layer, cls))
        new = conv_class(
            layer.in_channels, layer.out_channels, layer.kernel_size, stride=layer.stride, padding=layer.padding,
            dilation=layer.dilation, groups=layer.groups, bias=True, padding_mode=layer.padding_mode, **factory,
        )
    shape = (-1,) + (1,) * (weight.dim() - 1)
    new.weight.copy_((weight.to(wide) * factor.reshape(shape)).to(weight.dtype))
    new.bias.copy_(((bias - bn.running_mean.to(wide)) * factor + beta).to(weight.dtype))
    new.train(layer.training)
    return _carry_over(layer, new)


def _carry_over(layer: nn.Module, new: nn.Module) -> nn.Module:
    """``new`` with ``layer``'s weight mask, quantization config and activation pruner."""
    mask = weight_mask_of(layer)
    if mask is not None:
        attach_weight_mask(new, mask.mask.clone())
    new = quantized_like(layer, new)
    share_activation_pruner(layer, new)
    return new


@register_pass("fold_batchnorm", kind="transform", params=NoParams)
def fold_batchnorm(mg, params: NoParams):
    """Fold every BatchNorm that directly follows a Conv or a 2-D Linear into it (eval semantics)."""
    graph = mg.model.graph
    modules = mg.modules
    folded = []
    for node in list(graph.nodes):
        if not _foldable(node, modules, graph):
            continue
        producer = node.args[0]
        mg.replace_module(producer.target, folded_layer(modules[producer.target], modules[node.target]))
        node.replace_all_uses_with(producer)
        graph.erase_node(node)
        folded.append({"into": producer.name, "batch_norm": node.name})
    if mg.model.training and folded:
        logger.warning("fold_batchnorm: the model is in train mode; folded BatchNorms use running statistics")
    return PassResult({"folded": folded})
