"""A model a spec names by factory: a plain CNN taking ``pixel_values`` and returning logits."""

import torch.nn as nn


class SmallCNN(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, classes)

    def forward(self, pixel_values):
        return self.head(self.features(pixel_values).flatten(1))


def small_cnn(classes: int = 10) -> nn.Module:
    return SmallCNN(classes)
