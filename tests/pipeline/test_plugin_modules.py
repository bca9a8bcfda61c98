"""A plug-in file is importable by its own name, so a spec's factory can name it (``"nets:make"`` for
``"plugins": ["nets.py"]``) under both capture modes; a file never shadows a module that exists elsewhere."""

import json
import sys

import pytest

from mase_lite.cli import main
from mase_lite.pipeline.plugins import import_plugins

NETS = '''
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, classes)

    def forward(self, pixel_values):
        return self.head(self.conv(pixel_values).mean((2, 3)))


def make(classes: int = 10):
    return Net(classes)
'''


@pytest.fixture
def nets_file(tmp_path, monkeypatch):
    name = f"nets_{tmp_path.name.replace('-', '_')}"[:40]
    (tmp_path / f"{name}.py").write_text(NETS)
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("capture", ["modules", "auto", "graph"])
def test_a_spec_names_a_factory_in_its_plugin_file(capture, nets_file, tmp_path, capsys):
    spec = {"plugins": [f"{nets_file}.py"], "model": {"task": "image-classification", "factory": f"{nets_file}:make"},
            "data": {"n_train": 16, "n_test": 8, "image_size": 8}, "capture": capture,
            "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"linear": {"weight": {"name": "mxint"}}}}},
                      {"pass": "evaluate", "params": {"progress": False}}],
            "output_dir": str(tmp_path / f"run_{capture}")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "spec.json")]) == 0, capsys.readouterr().err
    report = json.loads((tmp_path / f"run_{capture}" / "report.json").read_text())
    assert report["metrics"]["evaluate"]["n"] == 8


def test_a_plugin_file_never_shadows_an_existing_module(tmp_path):
    (tmp_path / "json.py").write_text("LOADED = True\n")
    import_plugins(["json.py"], base=tmp_path)
    assert sys.modules["json"].__name__ == "json" and not hasattr(sys.modules["json"], "LOADED")
