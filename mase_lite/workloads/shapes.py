"""Procedurally drawn images in ten classes: the default image-classification set.

Each image is a shape or a texture in a random colour on a random background, at a random position
and scale, with pixel noise: disc, square, triangle, plus, cross, ring, horizontal stripes,
vertical stripes, diagonal stripes, checkerboard. A small CNN tells them apart within a minute.

Example::

    >>> images, labels = draw_shapes(8, size=32, seed=0)
    >>> images.shape, images.dtype, labels.tolist()[:4]
    (torch.Size([8, 3, 32, 32]), torch.uint8, [4, 9, 3, 0])
"""

from __future__ import annotations

import torch

CLASSES = (
    "disc", "square", "triangle", "plus", "cross", "ring",
    "horizontal-stripes", "vertical-stripes", "diagonal-stripes", "checkerboard",
)


def _masks(label: torch.Tensor, y: torch.Tensor, x: torch.Tensor, radius: torch.Tensor,
           period: torch.Tensor) -> torch.Tensor:
    """Foreground masks ``[n, size, size]`` for each image's class; ``x``/``y`` are centred coordinates."""
    r = radius[:, None, None]
    ax, ay = x.abs(), y.abs()
    thick = r * 0.22  # thin arms: a plus or a cross is not a blob at 32 pixels
    phase = (2 * torch.pi / period)[:, None, None]
    shapes = [
        x**2 + y**2 <= r**2,                                               # disc
        (ax <= r * 0.85) & (ay <= r * 0.85),                               # square
        (y <= r * 0.8) & (y >= -r * 0.8 + 2 * ax),                         # triangle (apex up)
        ((ax <= thick) & (ay <= r)) | ((ay <= thick) & (ax <= r)),         # plus
        ((x - y).abs() <= thick * 1.2) & (ax <= r) & (ay <= r)
        | ((x + y).abs() <= thick * 1.2) & (ax <= r) & (ay <= r),          # cross
        (x**2 + y**2 <= r**2) & (x**2 + y**2 >= (r * 0.6) ** 2),           # ring
        torch.sin(y * phase) > 0,                                          # horizontal stripes
        torch.sin(x * phase) > 0,                                          # vertical stripes
        torch.sin((x + y) * phase * 0.7071) > 0,                           # diagonal stripes
        (torch.sin(x * phase) > 0) ^ (torch.sin(y * phase) > 0),           # checkerboard
    ]
    stacked = torch.stack(shapes, 1)  # [n, classes, size, size]
    return stacked[torch.arange(len(label)), label]


def draw_shapes(n: int, size: int = 32, seed: int = 0, noise: float = 12.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` RGB images ``[n, 3, size, size]`` (uint8) and their labels, the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, len(CLASSES), (n,), generator=g)
    radius = size * (0.22 + 0.18 * torch.rand(n, generator=g))
    centre = size / 2 + (torch.rand(n, 2, generator=g) - 0.5) * size * 0.3
    period = size * (0.15 + 0.15 * torch.rand(n, generator=g))
    grid = torch.arange(size, dtype=torch.float32) + 0.5
    y = (grid[None, :, None] - centre[:, 0, None, None]).expand(n, size, size)
    x = (grid[None, None, :] - centre[:, 1, None, None]).expand(n, size, size)
    mask = _masks(label, y, x, radius, period)
    fg = torch.rand(n, 3, generator=g) * 255
    bg = torch.rand(n, 3, generator=g) * 255
    # keep the two colours apart so that every shape is visible
    far = (fg - bg).abs().sum(1, keepdim=True) < 150
    fg = torch.where(far, 255 - bg, fg)
    image = torch.where(mask[:, None], fg[:, :, None, None], bg[:, :, None, None])
    image = image + noise * torch.randn(image.shape, generator=g)
    return image.round().clamp(0, 255).to(torch.uint8), label
