"""Small models the robustness tests save and load."""

import torch.nn as nn


def tiny(width: int = 4) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.Dropout(0.1))


class Doubler(nn.Module):
    """A leaf-module class that is registered, not imported from the file."""

    def forward(self, x):
        return x * 2
