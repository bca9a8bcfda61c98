"""Labelled images for image classification, stored as uint8 and normalised batch by batch.

Every image is resized to ``image_size`` and converted to the model's channels once; a batch is
scaled to 0..1 and normalised with the per-channel mean and standard deviation of the train split,
or with an image processor's (a pretrained model's own ``image_mean``/``image_std``).

Example::

    data = ImageData(images, labels, classes, image_size=32, channels=3)
    batch = data.example_batch(4)      # pixel_values [4, 3, 32, 32] float32, labels [4]
"""

from __future__ import annotations

import torch

from mase_lite.infra.errors import UserError
from mase_lite.workloads.images import channel_stats, resize_stack
from mase_lite.workloads.splits import SPLITS, SplitData, digest


class ImageData(SplitData):
    """Train and test images ``[n, C, S, S]`` (uint8) with integer labels and class names."""

    task = "image-classification"
    cache_tensors = False  # decoding and resizing is cheap next to storing every image twice

    def __init__(
        self,
        images: dict[str, list[torch.Tensor]],
        labels: dict[str, list[int]],
        classes: tuple[str, ...],
        image_size: int,
        channels: int,
        num_labels: int | None = None,
        normalisation: tuple[list[float], list[float]] | None = None,
        seed: int = 0,
    ):
        seen = max((max(labels[s], default=0) for s in SPLITS), default=0) + 1
        self.num_labels = num_labels if num_labels is not None else max(len(classes), seen, 2)
        for split in SPLITS:
            if not images[split]:
                raise UserError(f"the {split} split has no images")
            for row, label in enumerate(labels[split], start=1):
                if not 0 <= label < self.num_labels:
                    raise UserError(
                        f"{split} split, row {row}: label {label} is outside num_labels = {self.num_labels} "
                        f"(allowed: 0..{self.num_labels - 1})"
                    )
        self.classes = classes or tuple(str(c) for c in range(self.num_labels))
        self.image_size = image_size
        self.channels = channels
        self.seed = seed
        stored = {s: resize_stack(images[s], image_size, channels) for s in SPLITS}
        self.tensors = {s: {"pixel_values": stored[s], "labels": torch.tensor(labels[s], dtype=torch.long)} for s in SPLITS}
        mean, std = normalisation or channel_stats(stored["train"])
        if len(mean) != channels or len(std) != channels:
            raise UserError(f"the image processor normalises {len(mean)} channels; the images have {channels}")
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.fingerprint = digest(
            "image-classification", *(t for s in SPLITS for t in self.tensors[s].values()), mean, std, self.classes
        )

    def transform(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        pixels = (batch["pixel_values"].float() / 255 - self.mean) / self.std
        return {"pixel_values": pixels, "labels": batch["labels"]}
