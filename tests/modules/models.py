"""A model torch.export refuses: a branch on a tensor's value and a Python loop over a runtime value."""

import torch
import torch.nn as nn


class Refined(nn.Module):
    """Classifies images; refines its features a data-dependent number of times."""

    def __init__(self, classes: int = 10, channels: int = 3, hidden: int = 32):
        super().__init__()
        self.stem = nn.Conv2d(channels, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.proj = nn.Linear(32, hidden)
        self.refine = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, pixel_values):
        h = self.proj(self.pool(torch.relu(self.stem(pixel_values))).flatten(1))
        if h.mean() > 0:  # a branch on a value: export cannot guard on it
            h = torch.relu(h)
        for _ in range(int(h.abs().mean() * 4) % 3 + 1):  # a loop over a runtime value
            h = h + torch.tanh(self.refine(h))
        return self.head(h)


def refined(classes: int = 10) -> nn.Module:
    return Refined(classes)
