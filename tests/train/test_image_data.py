"""Image-classification data: folders with grey and colour images, .npz arrays, the hub path on a local
folder, resizing, channels and normalisation."""

import numpy as np
import pytest
import torch
from PIL import Image

from mase_lite.infra.errors import UserError
from mase_lite.workloads.data import build_data
from mase_lite.workloads.images import resize_stack, to_chw
from mase_lite.workloads.shapes import CLASSES, draw_shapes


def make_folder(root, classes=("cat", "dog"), per_class=3, size=(10, 6)):
    """Per class: a grey PNG, a colour PNG and a colour JPEG (the JPEG is lossy), pixel values set by position."""
    made = {}
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            h, w = size
            value = 40 * c + 10 * i
            if i == 0:
                array = np.full((h, w), value, np.uint8)
                Image.fromarray(array, mode="L").save(root / name / f"{i}.png")
            else:
                array = np.zeros((h, w, 3), np.uint8)
                array[..., 0], array[..., 1], array[..., 2] = value, 255 - value, 128
                Image.fromarray(array).save(root / name / (f"{i}.png" if i == 1 else f"{i}.jpg"))
            made[(name, i)] = array
    return made


def test_to_chw_accepts_pil_arrays_and_tensors_in_any_layout():
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert to_chw(grey, "x").shape == (1, 3, 4)
    hwc = np.zeros((5, 6, 3), np.uint8)
    assert to_chw(hwc, "x").shape == (3, 5, 6) and to_chw(torch.zeros(3, 5, 6), "x").shape == (3, 5, 6)
    rgba = Image.fromarray(np.full((2, 2, 4), 200, np.uint8), mode="RGBA")
    assert to_chw(rgba, "x").tolist() == [[[200, 200], [200, 200]]] * 3
    assert to_chw(np.full((2, 2), 0.5, np.float32), "x").tolist() == [[[128, 128], [128, 128]]]  # 0..1 floats scaled
    with pytest.raises(UserError, match=r"row 7: an image must be HxW, HxWxC or CxHxW with 1, 3 or 4 channels; got shape \[2, 5, 5, 5\]"):
        to_chw(np.zeros((2, 5, 5, 5)), "row 7")


def test_resize_converts_grey_to_colour_and_colour_to_grey_by_luma():
    grey = torch.full((1, 4, 4), 90, dtype=torch.uint8)
    colour = torch.stack([torch.full((4, 4), 255), torch.zeros(4, 4), torch.zeros(4, 4)]).to(torch.uint8)
    out = resize_stack([grey, colour], size=4, channels=3)
    assert out[0].unique().tolist() == [90] and torch.equal(out[1], colour)
    assert resize_stack([colour], size=4, channels=1).unique().tolist() == [76]  # 0.299 * 255
    assert resize_stack([grey], size=2, channels=1).shape == (1, 1, 2, 2)


def test_image_folder_with_grey_and_colour_images_in_train_and_test_folders(tmp_path):
    made = {}
    for split in ("train", "test"):
        made[split] = make_folder(tmp_path / split)
    data = build_data({"dataset": "image-folder", "path": str(tmp_path), "image_size": 8}, task="image-classification")
    assert data.classes == ("cat", "dog") and data.channels == 3 and data.num_labels == 2
    stored = data.tensors["train"]["pixel_values"]
    assert stored.shape == (6, 3, 8, 8) and stored.dtype == torch.uint8
    assert data.tensors["train"]["labels"].tolist() == [0, 0, 0, 1, 1, 1]
    # the grey image became three equal channels; the lossless colour image kept its channel values
    assert (stored[0, 0] == stored[0, 1]).all() and stored[0].unique().tolist() == [0]
    assert stored[4, :, 3, 3].tolist() == [50, 205, 128]
    batch = data.example_batch(6)
    assert batch["pixel_values"].dtype == torch.float32
    # normalised with the train split's own per-channel statistics
    x = batch["pixel_values"]
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert torch.allclose(x.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-3)


def test_single_image_folder_is_split_by_test_fraction_and_grey_only_stays_grey(tmp_path):
    for c in ("a", "b", "c"):
        (tmp_path / c).mkdir()
        for i in range(5):
            Image.fromarray(np.full((6, 6), 20 * i, np.uint8), mode="L").save(tmp_path / c / f"{i}.png")
    data = build_data({"dataset": "image-folder", "path": str(tmp_path), "test_fraction": 0.2}, task="image-classification")
    assert (data.size("train"), data.size("test")) == (12, 3) and data.channels == 1 and data.image_size == 6
    with pytest.raises(UserError, match="needs at least two class subfolders"):
        build_data({"dataset": "image-folder", "path": str(tmp_path / "a")}, task="image-classification")


def test_npz_in_both_layouts(tmp_path):
    images, labels = draw_shapes(20, size=12, seed=0)
    hwc = images.permute(0, 2, 3, 1).numpy()
    np.savez(tmp_path / "split.npz", x_train=hwc[:15], y_train=labels[:15].numpy(), x_test=hwc[15:], y_test=labels[15:].numpy())
    data = build_data({"dataset": "npz", "path": str(tmp_path / "split.npz")}, task="image-classification")
    assert torch.equal(data.tensors["train"]["pixel_values"], images[:15]) and data.num_labels == 10
    np.savez(tmp_path / "one.npz", images=images[:, 0].numpy(), labels=labels.numpy())  # [n, H, W] grey
    data = build_data({"dataset": "npz", "path": str(tmp_path / "one.npz"), "test_fraction": 0.25}, task="image-classification")
    assert data.channels == 1 and (data.size("train"), data.size("test")) == (15, 5)
    np.savez(tmp_path / "bad.npz", pictures=hwc)
    with pytest.raises(UserError, match="needs the arrays x_train, y_train, x_test, y_test or images, labels; it has pictures"):
        build_data({"dataset": "npz", "path": str(tmp_path / "bad.npz")}, task="image-classification")


def test_hub_path_on_a_local_folder_gives_the_same_images_as_the_image_folder_reader(tmp_path):
    for split in ("train", "test"):
        make_folder(tmp_path / "pets" / split)
    ours = build_data({"dataset": "image-folder", "path": str(tmp_path / "pets"), "image_size": 8}, task="image-classification")
    hub = build_data({"dataset": str(tmp_path / "pets"), "image_size": 8}, task="image-classification", run_dir=tmp_path / "run")
    for split in ("train", "test"):
        order = hub.tensors[split]["labels"].argsort(stable=True)
        assert torch.equal(hub.tensors[split]["labels"][order], ours.tensors[split]["labels"])
        assert sorted(map(bytes, hub.tensors[split]["pixel_values"].numpy())) == sorted(map(bytes, ours.tensors[split]["pixel_values"].numpy()))
    with pytest.raises(UserError, match=r"no column 'img' \(data.image_column\); its columns are: image, label"):
        build_data({"dataset": str(tmp_path / "pets"), "image_column": "img"}, task="image-classification", run_dir=tmp_path / "run")


def test_synthetic_shapes_are_seeded_balanced_and_distinct():
    a, la = draw_shapes(200, size=16, seed=4)
    b, lb = draw_shapes(200, size=16, seed=4)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(a, draw_shapes(200, size=16, seed=5)[0])
    assert torch.bincount(la, minlength=len(CLASSES)).min() >= 10
    data = build_data({"n_train": 30, "n_test": 10}, task="image-classification")
    assert data.classes == CLASSES and data.image_size == 32 and data.size("test") == 10


@pytest.fixture
def own_registry(monkeypatch):
    """Datasets registered by a test are forgotten after it."""
    from mase_lite.workloads import datasets

    datasets.get_dataset("")  # the built-ins first
    monkeypatch.setattr(datasets, "_REGISTRY", dict(datasets._REGISTRY))


def test_labels_as_class_names_and_bad_labels(own_registry):
    from mase_lite.workloads.datasets import register_dataset

    rows = {"image": [np.zeros((4, 4), np.uint8)] * 4, "label": ["cat", "dog", "cat", "dog"]}

    register_dataset("named-labels", lambda spec, seed: {"train": rows, "test": rows}, tasks=("image-classification",))
    data = build_data({"dataset": "named-labels"}, task="image-classification")
    assert data.classes == ("cat", "dog") and data.tensors["test"]["labels"].tolist() == [0, 1, 0, 1]
    register_dataset("bad-labels", lambda spec, seed: {"train": {"image": rows["image"], "label": [0.5] * 4}, "test": rows},
                     tasks=("image-classification",))
    with pytest.raises(UserError, match=r"split 'train', row 1: label 0.5 is not an integer class index"):
        build_data({"dataset": "bad-labels"}, task="image-classification")
