"""mase_lite: capture a PyTorch model into a graph IR, then annotate, compress and explore it."""

__version__ = "0.1.0"
