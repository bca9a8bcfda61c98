"""Others' checkpoints as models of this tool: compressed-tensors directories and GGUF files, read as data, and
the hub's kinds of pretrained source."""
