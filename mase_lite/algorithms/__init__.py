"""Algorithms that rewrite a layer's weights from its calibration inputs, run by the passes one block at a time."""
