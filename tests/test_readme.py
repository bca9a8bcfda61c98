"""Every code block of the README runs as written, or is checked as far as a test can without minutes of work
(each such command says why in NOT_RUN): Python blocks run in order in one fresh interpreter, as a reader would
paste them into one session; JSON blocks validate and pass a search's pre-flight checks; command lines parse,
name files that exist, and the quick ones run. The same rules hold for the guides (tests/test_guides.py, with the
helpers below); the README's set-up commands are run by CI (.ci/run) and by the tests' own set-up."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mase_lite.cli import build_parser, main
from mase_lite.pipeline.spec import check_pipeline, load_spec
from tests.conftest import PATIENCE

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# command lines not run here, and why
NOT_RUN = {
    "run": "a whole pipeline: the README's main command runs pipelines/quickstart.json, the pipeline tests the others",
    "search": "a whole search: the search tests run searches",
    "bench": "minutes of timing: tests/bench runs its parts",
    "export": "needs a run's checkpoint: tests/test_guides.py runs the deploy guide's after its pipeline",
}


def blocks(page: Path) -> list[tuple[str, str]]:
    """(language, text) of each fenced code block of ``page``, in order."""
    return BLOCK.findall(page.read_text())


def command_lines(page_blocks) -> list[list[str]]:
    """The ``mase-lite`` command lines of the plain blocks, without the program name and the comments."""
    lines = []
    for lang, text in page_blocks:
        if lang == "":
            for line in text.splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith("mase-lite "):
                    lines.append(shlex.split(line)[1:])
    return lines


def run_python(page_blocks, cwd: Path) -> str:
    """The page's Python blocks, in order, in one fresh interpreter in ``cwd``; their stdout."""
    code = "\n".join(text for lang, text in page_blocks if lang == "python")
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=PATIENCE,
                          env={**os.environ, "TQDM_DISABLE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def check_spec(spec: dict) -> None:
    """A JSON block as a user would run it: a search spec passes the search's pre-flight checks (its base pipeline a
    shipped one), a pipeline spec the pipeline's; neither runs (minutes of training)."""
    from mase_lite.search.engine import prepare_studies
    from mase_lite.search.spec import load_search_spec

    if "space" in spec:
        search = load_search_spec(spec)
        search._base_dir = ROOT / "pipelines"
        assert prepare_studies(search)  # every path, value and metric checked
    else:
        check_pipeline(load_spec({**spec, "device": "cpu"}))


def run_command_line(argv: list[str], tmp_path: Path, monkeypatch, capsys, named_elsewhere=()) -> None:
    """Parse ``argv``; a command in NOT_RUN must name files that exist (or that the page makes first:
    ``named_elsewhere``) and is skipped, any other runs in ``tmp_path`` and prints something."""
    args = build_parser().parse_args(argv)
    named = getattr(args, "spec", None)
    if args.command in NOT_RUN:
        assert named is None or named.startswith("runs/") or named in named_elsewhere or (ROOT / named).is_file(), named
        pytest.skip(f"not run: {NOT_RUN[args.command]}")
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    assert capsys.readouterr().out


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading."""
    text = re.sub(r"[^\w\s-]", "", re.sub(r"`", "", heading).lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` (outside its code) whose file, or heading, does not exist."""
    text = BLOCK.sub("", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", BLOCK.sub("", file.read_text()), re.M)
            if anchor not in {slug(h) for h in headings}:
                broken.append(target)
    return broken


README = ROOT / "README.md"
BLOCKS = blocks(README)


def test_the_readme_blocks_are_the_ones_this_test_knows():
    assert [lang for lang, _ in BLOCKS] == ["", "", "python", ""]


def test_the_readme_is_a_short_guide_whose_links_resolve():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    assert not broken_links(README)


def test_ci_finds_the_test_command_after_its_marker():
    """.ci/run takes the second line after the marker, as this awk does."""
    lines = README.read_text().splitlines()
    for marker, tail in (("<!-- main-command -->", "mase-lite run pipelines/quickstart.json"),
                         ("<!-- test-command -->", "python -m pytest -q -n 2")):
        at = lines.index(marker)
        assert lines[at + 1] == "```" and lines[at + 2].endswith(tail)


def test_the_tour_runs_in_one_session(tmp_path):
    out = run_python(BLOCKS, tmp_path)
    assert out.startswith("['bert_encoder_layer_0_attention_self_query'")
    assert "{'weights': 8.0, 'activations': 8.0}" in out and out.rstrip().endswith("tensor(True)")
    assert (tmp_path / "bert.svg").is_file() and (tmp_path / "runs" / "bert" / "recipe.json").is_file()
    assert (tmp_path / "bert.pt2").is_file() and (tmp_path / "bert.onnx").is_file()


@pytest.mark.parametrize("argv", command_lines(BLOCKS), ids=" ".join)
def test_command_lines_parse_and_the_quick_ones_run(argv, tmp_path, monkeypatch, capsys):
    run_command_line(argv, tmp_path, monkeypatch, capsys)


def test_the_json_helper_checks_what_it_is_given():
    """check_spec refuses a spec with a mistake (so a guide's block passing it means something)."""
    with pytest.raises(Exception, match="epochz"):
        check_spec({"steps": [{"pass": "train", "params": {"epochz": 1}}]})
    check_spec(json.loads((ROOT / "pipelines" / "qat_int8.json").read_text()))
