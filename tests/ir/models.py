"""Small models the IR tests capture."""

import torch
import torch.nn as nn


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        x = self.relu(self.bn2(self.conv2(x)))
        return self.fc(self.flatten(self.avg(x)))


def small_cnn(classes: int = 10) -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN(classes)


class TwiceMLP(nn.Module):
    """Calls ``hidden`` and ``act`` twice."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.hidden = nn.Linear(32, 32)
        self.act = nn.GELU()
        self.drop = nn.Dropout(0.3)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        h = self.act(self.inp(x))
        h = self.act(self.hidden(h))
        h = self.drop(self.act(self.hidden(h)))
        return self.out(h)


class Gate(nn.Module):
    """A user leaf module with two inputs and a parameter."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim) * 0.5)

    def forward(self, a, b):
        return a * self.scale + torch.sigmoid(b)


class GatedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.left = nn.Linear(8, 8)
        self.right = nn.Linear(8, 8)
        self.gate = Gate(8)
        self.head = nn.Linear(8, 2)

    def forward(self, x, y):
        return self.head(self.gate(self.left(x), self.right(y)))


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # data-dependent control flow: export cannot capture this
            return h
        return -h
