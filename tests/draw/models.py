"""Small models the drawing tests capture."""

import torch
import torch.nn as nn


class Squared(nn.Module):
    """``fc``'s output feeds one multiplication twice."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h * h


class Looped(nn.Module):
    """One block called three times in a python loop (capture unrolls it)."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    def forward(self, x):
        for _ in range(3):
            x = self.block(x)
        return x


class Block(nn.Module):
    def __init__(self, gated: bool):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.gated = gated

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return h * torch.sigmoid(h) if self.gated else h


class Blocks(nn.Module):
    """Two chained blocks named ``blocks.0`` and ``blocks.1`` of one class; ``gates`` picks their structure."""

    def __init__(self, gates: tuple[bool, bool]):
        super().__init__()
        self.blocks = nn.ModuleList(Block(g) for g in gates)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)
