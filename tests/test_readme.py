"""Every code block of the README runs as written, or is checked as far as a test can without minutes of
work (each such block says why below): Python blocks run in order in one fresh interpreter, as a reader
would paste them into one session; JSON blocks validate and pass a search's pre-flight checks; command
lines parse, name files that exist, and the quick ones run."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import mase_lite as ml
from mase_lite.cli import build_parser, main
from mase_lite.pipeline.spec import check_pipeline, load_spec
from tests.conftest import PATIENCE

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
BLOCKS = [(lang, text) for lang, text in BLOCK.findall((ROOT / "README.md").read_text())]
# command lines not run here, and why
NOT_RUN = {
    "run": "a whole pipeline: the README's main command runs pipelines/quickstart.json",
    "search": "a whole search: the search tests run searches",
    "bench": "minutes of timing: tests/bench runs its parts",
    "export": "needs a run's checkpoint: test_the_deploy_example_runs_shrunk_with_the_same_keys_and_exports_as_its_lines_say runs them",
}


def test_the_readme_blocks_are_the_ones_this_test_knows():
    assert [lang for lang, _ in BLOCKS] == ["", "", "python", "python", "json", "python", "", "json", "", "python", "json",
                                            "json", ""]


def test_python_blocks_run_in_one_session(tmp_path):
    code = "\n".join(text for lang, text in BLOCKS if lang == "python")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=PATIENCE,
                          env={**os.environ, "TQDM_DISABLE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("['bert_encoder_layer_0_attention_self_query'")
    assert (tmp_path / "bert.svg").is_file() and (tmp_path / "bert.graphml").is_file()
    assert (tmp_path / "runs" / "bert" / "recipe.json").is_file()
    # the model export refuses ran in module mode, and its checkpoint says so
    assert "\nmodules 32\n" in proc.stdout
    assert json.loads((tmp_path / "runs" / "refined" / "checkpoint" / "recipe.json").read_text())["capture"] == "modules"


def test_json_blocks_are_specs_that_pass_their_checks():
    from mase_lite.search.engine import prepare_studies
    from mase_lite.search.spec import load_search_spec

    pipeline, search, ptq, deploy = (json.loads(text) for lang, text in BLOCKS if lang == "json")
    check_pipeline(load_spec({**pipeline, "device": "cpu"}))  # not run: it trains a 4-layer Qwen for 2 epochs
    check_pipeline(load_spec({**ptq, "device": "cpu"}))  # not run: it trains, calibrates and runs GPTQ
    check_pipeline(load_spec({**deploy, "device": "cpu"}))  # not run: it trains and runs GPTQ (tests/deploy export)
    spec = load_search_spec(search)
    spec._base_dir = ROOT / "pipelines"  # its pipeline, qat_int8.json, is a shipped spec
    assert len(prepare_studies(spec)) == 1  # every path, value and metric checked; not run: 40 trainings


def _command_lines():
    for lang, text in BLOCKS:
        if lang == "":
            for line in text.splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith("mase-lite "):
                    yield shlex.split(line)[1:]


@pytest.mark.parametrize("argv", list(_command_lines()), ids=" ".join)
def test_command_lines_parse_and_the_quick_ones_run(argv, tmp_path, monkeypatch, capsys):
    args = build_parser().parse_args(argv)
    named = [getattr(args, "spec", None)]
    if args.command in NOT_RUN:
        assert all(n is None or n.startswith(("runs/", "spec.json")) or (ROOT / n).is_file() for n in named), named
        pytest.skip(f"not run: {NOT_RUN[args.command]}")
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    assert capsys.readouterr().out


def test_the_deploy_example_runs_shrunk_with_the_same_keys_and_exports_as_its_lines_say(tmp_path, monkeypatch):
    """The README's W4A16 deploy pipeline, smaller (same keys), then its two export lines verbatim."""
    deploy = [json.loads(text) for lang, text in BLOCKS if lang == "json"][3]
    deploy["model"]["hf_config"].update(hidden_size=128, num_hidden_layers=1, intermediate_size=256)
    deploy["data"].update(n_train=64, n_test=16)
    deploy["steps"][0]["params"]["epochs"] = 1
    deploy["steps"][2]["params"]["num_batches"] = 2
    monkeypatch.chdir(tmp_path)
    assert ml.run_pipeline(deploy).report["status"] == "ok"
    lines = [line for line in _command_lines() if line[:1] == ["export"] and "runs/w4a16" in line[1]]
    assert {"onnx", "pt2"} <= {line[3] for line in lines}
    for argv in lines:
        assert main(argv) == 0 and (tmp_path / argv[-1]).exists()
