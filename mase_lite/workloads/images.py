"""Images from anywhere as uint8 tensors: folders of PNG/JPEG files, ``.npz`` arrays, PIL images, arrays.

Example::

    tables = image_folder_tables(Path("pets"), "train", "test", test_fraction=0.2, seed=0)
    images = [to_chw(x, "pets/cat/1.png") for x in tables["train"][1]["image"]]
    batch = resize_stack(images, size=32, channels=3)        # [n, 3, 32, 32] uint8
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
import torch.nn.functional as F

from mase_lite.infra.errors import UserError
from mase_lite.infra.files import check_inside
from mase_lite.infra.limits import check_fits
from mase_lite.workloads.sources import MAX_LABEL

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
_LUMA = torch.tensor([0.299, 0.587, 0.114])


MAX_PIXELS = 1 << 26  # one image's pixels (8192 x 8192): a larger one is a decompression bomb, not data


def _size(path: Path) -> tuple[int, int]:
    """An image file's declared width and height, read from its header before anything is decoded."""
    from PIL import Image

    if not path.is_file():
        raise UserError(f"{path}: not a regular file")
    try:
        with Image.open(path) as im:
            width, height = im.size
    except Exception as err:  # an image file is data: whatever its parser trips on, it is not a readable image
        raise UserError(f"{path}: not a readable image ({type(err).__name__}: {str(err)[:120]})") from None
    if width * height > MAX_PIXELS:
        raise UserError(f"{path}: an image of {width} x {height} pixels, more than the {MAX_PIXELS} one image may have")
    return width, height


def _open(path: Path) -> torch.Tensor:
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            return to_chw(im, str(path))
    except UserError:
        raise
    except Exception as err:  # a damaged or hostile file (text-chunk bombs, fuzzed headers): not a readable image
        raise UserError(f"{path}: not a readable image ({type(err).__name__}: {str(err)[:120]})") from None


def to_chw(image: Any, where: str) -> torch.Tensor:
    """An image (PIL image, HxW / HxWxC / CxHxW array or tensor) as a uint8 ``[C, H, W]`` tensor, C in 1, 3."""
    if hasattr(image, "mode") and hasattr(image, "convert"):  # PIL
        image = image.convert("L" if image.mode in ("1", "L", "I", "I;16", "F") else "RGB")
        array = np.asarray(image)
    else:
        array = np.asarray(image.numpy() if isinstance(image, torch.Tensor) else image)
    if array.ndim == 2:
        array = array[None]
    elif array.ndim == 3 and array.shape[-1] in (1, 3, 4) and array.shape[0] not in (1, 3, 4):
        array = np.moveaxis(array, -1, 0)
    if array.ndim != 3 or array.shape[0] not in (1, 3, 4):
        raise UserError(f"{where}: an image must be HxW, HxWxC or CxHxW with 1, 3 or 4 channels; got shape {list(array.shape)}")
    array = array[:3]
    if array.dtype != np.uint8:
        if (not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array) or array.dtype == np.bool_
                or not np.isfinite(array).all()):
            raise UserError(f"{where}: image values must be finite real numbers, got {array.dtype}")
        scale = 255.0 if array.max(initial=0) <= 1.0 and np.issubdtype(array.dtype, np.floating) else 1.0
        array = np.clip(np.rint(array * scale), 0, 255).astype(np.uint8)
    array = np.ascontiguousarray(array)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def resize_stack(images: list[torch.Tensor], size: int, channels: int) -> torch.Tensor:
    """uint8 ``[n, channels, size, size]``: each image resized (bilinear, antialiased) and converted to
    grey (luma) or colour (grey repeated) as ``channels`` asks."""
    out = torch.empty(len(images), channels, size, size, dtype=torch.uint8)
    for i, image in enumerate(images):
        x = image.float()
        if x.shape[0] == 1 and channels == 3:
            x = x.expand(3, -1, -1)
        elif x.shape[0] == 3 and channels == 1:
            x = (x * _LUMA[:, None, None]).sum(0, keepdim=True)
        if tuple(x.shape[1:]) != (size, size):
            x = F.interpolate(x[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
        out[i] = x.round().clamp(0, 255).to(torch.uint8)
    return out


def channel_stats(images: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of uint8 images ``[n, C, H, W]``, on the 0..1 scale."""
    x = images.double() / 255
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp(min=1e-3)
    return mean.tolist(), std.tolist()


def _class_dirs(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))


def _folder_rows(directory: Path, classes: list[str], root: Path) -> list[dict]:
    rows = []
    for label, name in enumerate(classes):
        folder = directory / name
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS) if folder.is_dir() else []
        for path in files:
            if not path.is_file():
                raise UserError(f"{path}: not a regular file (an image folder holds image files)")
            check_inside(path, root, "data.path")
        rows += [{"image": path, "label": label} for path in files]
    return rows


def image_folder_tables(path: Path, train_split: str, test_split: str) -> tuple[dict[str, tuple[str, dict]], tuple[str, ...]]:
    """``({"train"|"test": (source, {"image": [...], "label": [...]})}, class names)`` from a folder with
    ``train/`` and ``test/`` folders that each have one subfolder per class, or ``{"all": ...}`` from a
    folder with one subfolder per class (the run splits it by ``data.test_fraction``)."""
    if not path.is_dir():
        raise UserError(f"data.path = {str(path)!r} is not a directory (an image folder has one subfolder per class)")
    if (path / train_split).is_dir() and (path / test_split).is_dir():
        classes = sorted({d.name for split in (train_split, test_split) for d in _class_dirs(path / split)})
        parts = {"train": path / train_split, "test": path / test_split}
    else:
        classes = [d.name for d in _class_dirs(path)]
        parts = {"all": path}
    if len(classes) < 2:
        raise UserError(f"data.path = {str(path)!r}: an image folder needs at least two class subfolders; found {classes or 'none'}")
    rows = {split: _folder_rows(folder, classes, path) for split, folder in parts.items()}
    for split, folder in parts.items():
        if not rows[split]:
            raise UserError(f"{folder}: no images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    pixels = sum(w * h for split in rows for r in rows[split] for w, h in [_size(r["image"])])
    check_fits("data.path", pixels * 3 * 2, f"the images of {path} ({pixels} pixels, decoded and resized)")
    tables = {split: (str(parts[split]), {"image": [_open(r["image"]) for r in rows[split]],
                                          "label": [r["label"] for r in rows[split]]}) for split in parts}
    return tables, tuple(classes)


NPZ_KEYS = (("x_train", "y_train", "x_test", "y_test"), ("images", "labels"))


def npz_tables(path: Path) -> dict[str, tuple[str, dict]]:
    """Images and labels from an ``.npz``: ``x_train, y_train, x_test, y_test``, or ``images, labels`` (``{"all": ...}``,
    split by the run). Arrays are ``[n, H, W]``, ``[n, H, W, C]`` or ``[n, C, H, W]``."""
    if not path.is_file():
        raise UserError(f"data.path = {str(path)!r} does not exist (give an .npz file)")
    if not zipfile.is_zipfile(path):
        raise UserError(f"data.path = {str(path)!r}: not an .npz file (an .npz is a zip of .npy arrays)")
    check_fits("data.path", _npz_bytes(path), f"the arrays of {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise UserError(f"data.path = {str(path)!r}: not a readable .npz file ({err})") from None
    if all(k in arrays for k in NPZ_KEYS[0]):
        parts = {"train": (arrays["x_train"], arrays["y_train"]), "test": (arrays["x_test"], arrays["y_test"])}
    elif all(k in arrays for k in NPZ_KEYS[1]):
        parts = {"all": (arrays["images"], arrays["labels"])}
    else:
        raise UserError(
            f"data.path = {str(path)!r}: an .npz needs the arrays x_train, y_train, x_test, y_test or images, labels; "
            f"it has {', '.join(arrays) or 'none'}"
        )
    tables = {}
    for split, (images, labels) in parts.items():
        source = f"{path} ({split})"
        if images.ndim not in (3, 4) or 0 in images.shape[1:]:
            raise UserError(f"{source}: images of shape {list(images.shape)}; expected [n, H, W], [n, H, W, C] or "
                            "[n, C, H, W] with H and W at least 1")
        if labels.ndim != 1 or len(images) != len(labels):
            raise UserError(f"{source}: {len(images)} images but labels of shape {list(labels.shape)}")
        if labels.dtype.kind not in "iub" or (labels.size and (int(labels.min()) < 0 or int(labels.max()) > MAX_LABEL)):
            numbers = labels.size and labels.dtype.kind in "iubf"  # a range to show (not of strings or objects)
            raise UserError(f"{source}: labels must be integers 0 .. {MAX_LABEL}, got {labels.dtype} "
                            f"{f'values {labels.min()} .. {labels.max()}' if numbers else ''}".strip())
        tables[split] = (source, {"image": list(images), "label": labels.tolist()})
    return tables


def _npz_bytes(path: Path) -> int:
    """The bytes the members of an .npz take once loaded, read before any is loaded: an array's from its .npy header
    (an array declaring more elements than memory holds is refused before anything is allocated), any other
    member's its size (numpy reads it as bytes). A member whose header does not parse is refused here."""
    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:
                    total += _member_bytes(member, info.file_size)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, TypeError) as err:
        raise UserError(f"data.path = {str(path)!r}: not a readable .npz file ({err})") from None
    return total


def _member_bytes(member: IO[bytes], size: int) -> int:
    """What ``np.load`` allocates for one member of ``size`` bytes: an array if it starts as a .npy does, else bytes."""
    if member.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
        return size
    member.seek(0)
    version = np.lib.format.read_magic(member)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(member)
    return math.prod(shape) * dtype.itemsize
