"""Plug-ins without packaging (a file or module named by a spec or --plugin), and a real installed distribution."""

import json
import subprocess
import sys
import textwrap

import pytest

from mase_lite.cli import main
from mase_lite.pipeline.spec import load_spec

PLUGIN = '''
from mase_lite.passes import PassResult, register_pass
from pydantic import BaseModel

class GreetParams(BaseModel):
    who: str = "world"

@register_pass("{name}", kind="analysis", params=GreetParams)
def greet(mg, params):
    """Say hello in the report."""
    return PassResult(metrics={{"hello": params.who}})
'''


def _write_plugin(path, name):
    path.write_text(PLUGIN.format(name=name))
    return path


def test_a_spec_names_a_plugin_file_relative_to_itself(tmp_path, capsys):
    _write_plugin(tmp_path / "my_passes.py", "test_plugin_file_greet")
    spec = {
        "plugins": ["my_passes.py"],
        "data": None,
        "example_inputs": {"x": {"shape": [2, 16]}},
        "model": {"factory": "tests.ir.models:TwiceMLP"},
        "steps": [{"pass": "test_plugin_file_greet", "params": {"who": "mase"}}],
        "output_dir": str(tmp_path / "out"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert load_spec(tmp_path / "spec.json").steps[0].params.who == "mase"
    assert main(["run", str(tmp_path / "spec.json")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["metrics"] == {"test_plugin_file_greet": {"hello": "mase"}}


def test_cli_plugin_flag_and_errors(tmp_path, capsys):
    plugin = _write_plugin(tmp_path / "flag_passes.py", "test_plugin_flag_greet")
    assert main(["--plugin", str(plugin), "passes"]) == 0
    assert "test_plugin_flag_greet (analysis): Say hello in the report." in capsys.readouterr().out
    assert main(["--plugin", str(tmp_path / "missing.py"), "passes"]) == 2
    assert f"plugins.0: no such file: {tmp_path / 'missing.py'}" in capsys.readouterr().err
    assert main(["--plugin", "no_such_plugin_module", "passes"]) == 2
    assert "plugins.0: cannot import module 'no_such_plugin_module'" in capsys.readouterr().err


@pytest.fixture
def installed_plugin(tmp_path):
    """A real distribution with a `mase_lite.passes` entry point, installed into this environment."""
    root = tmp_path / "dist"
    (root / "greet_plugin_dist").mkdir(parents=True)
    _write_plugin(root / "greet_plugin_dist" / "__init__.py", "test_entry_point_greet")
    (root / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "greet-plugin-dist"
        version = "0.0.1"
        [project.entry-points."mase_lite.passes"]
        greet = "greet_plugin_dist"
    '''))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", "--no-index", str(root)], check=True)
    yield
    subprocess.run([*pip, "uninstall", "-y", "greet-plugin-dist"], check=True)


def test_an_installed_distribution_registers_its_passes(installed_plugin, tmp_path):
    listing = subprocess.run(
        [sys.executable, "-m", "mase_lite.cli", "passes", "--json"], capture_output=True, text=True, check=True
    )
    entry = json.loads(listing.stdout)["test_entry_point_greet"]
    assert entry["kind"] == "analysis" and entry["params"]["who"]["default"] == "world"
    schema = subprocess.run(
        [sys.executable, "-m", "mase_lite.cli", "schema", "pipeline"], capture_output=True, text=True, check=True
    )
    assert "test_entry_point_greet_step" in json.loads(schema.stdout)["$defs"]
