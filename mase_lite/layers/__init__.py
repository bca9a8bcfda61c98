"""The layers passes put into a model: quantized Linear/Conv layers and ops with their per-operand configs, LoRA,
pruning masks, registered replacements and presets, and a layer's parameters as stored codes."""
