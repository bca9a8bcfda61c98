"""Every code block of the guides (docs/guides/*.md) runs as written, or is checked as far as a test can without
minutes of work, by the README's rules (tests/test_readme.py): a page's Python blocks run in order in one fresh
interpreter; JSON blocks pass the checks a run or search makes before its first step; command lines parse, name
files that exist, and the quick ones run. Blocks run in whole elsewhere in this file: the deploy guide's W4A16
pipeline (shrunk, same keys) with its export lines, and the real-model guide's task file and JSON on a small GGUF."""

import json
import random
from pathlib import Path

import pytest
import torch

import mase_lite as ml
from mase_lite.cli import main
from tests.test_readme import ROOT, blocks, broken_links, check_spec, command_lines, run_command_line, run_python

GUIDES = ROOT / "docs" / "guides"
PAGES = sorted(GUIDES.glob("*.md"))
BLOCKS = {page.name: blocks(page) for page in PAGES}
# JSON blocks not checked by check_spec, and why
NOT_CHECKED = {"real-model.md": "its model is a GGUF file on the reader's disk: "
                                "test_the_real_model_guide_runs_on_a_small_gguf writes one and runs the spec"}
# files a page's command lines name that the page writes first
WRITTEN_BY_THE_PAGE = {"search.md": ("spec.json",), "real-model.md": ("smollm2-w4.json",)}
# what each page's Python session prints, and the files it leaves, when it ran as written
PYTHON = {
    "pipelines.md": ([], ["bert.svg", "bert.graphml"]),
    "tasks.md": (["modules 32"], ["runs/refined/checkpoint/recipe.json"]),
    "extend.md": (["14", "tensor([ 0.1000, -0.8000,  0.5000])", "8"],
                  ["bert-weights/weights.safetensors", "runs/moods/report.json"]),
}
WORDS = "the a small big dog cat runs sleeps on under mat house".split()


def test_the_guides_are_the_pages_the_site_lists():
    assert [p.name for p in PAGES] == ["compress-llm.md", "deploy.md", "extend.md", "labs.md", "pipelines.md",
                                       "real-model.md", "search.md", "tasks.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_has_a_title_known_blocks_and_links_that_resolve(page):
    text = page.read_text()
    assert text.startswith("# ") and text.count("\n# ") == 0
    langs = {lang for lang, _ in BLOCKS[page.name]}
    assert langs <= ({"", "python", "json", "yaml"} if page.name == "real-model.md" else {"", "python", "json"})
    assert ("python" in langs) == (page.name in PYTHON)
    assert not broken_links(page)


@pytest.mark.parametrize("name", sorted(PYTHON))
def test_python_blocks_of_a_page_run_in_one_session(name, tmp_path):
    out = run_python(BLOCKS[name], tmp_path).splitlines()
    printed, files = PYTHON[name]
    assert out == printed
    assert all((tmp_path / f).is_file() for f in files), files
    if name == "tasks.md":  # the model export refuses ran in module mode, and its checkpoint says so
        recipe = json.loads((tmp_path / "runs" / "refined" / "checkpoint" / "recipe.json").read_text())
        assert recipe["capture"] == "modules"


SPECS = [(page.name, i, text) for page in PAGES if page.name not in NOT_CHECKED
         for i, text in enumerate(t for lang, t in BLOCKS[page.name] if lang == "json")]


@pytest.mark.parametrize("name,i,text", SPECS, ids=[f"{n}-{i}" for n, i, _ in SPECS])
def test_json_blocks_are_specs_that_pass_their_checks(name, i, text):
    check_spec(json.loads(text))


LINES = [(page.name, argv) for page in PAGES for argv in command_lines(BLOCKS[page.name])]


@pytest.mark.parametrize("name,argv", LINES, ids=[f"{n}: {' '.join(a)}" for n, a in LINES])
def test_command_lines_parse_and_the_quick_ones_run(name, argv, tmp_path, monkeypatch, capsys):
    run_command_line(argv, tmp_path, monkeypatch, capsys, WRITTEN_BY_THE_PAGE.get(name, ()))


def test_the_deploy_example_runs_shrunk_with_the_same_keys_and_exports_as_its_lines_say(tmp_path, monkeypatch):
    """The deploy guide's W4A16 pipeline, smaller (same keys), then its two export lines verbatim."""
    page = BLOCKS["deploy.md"]
    deploy = [json.loads(text) for lang, text in page if lang == "json"][0]
    deploy["model"]["hf_config"].update(hidden_size=128, num_hidden_layers=1, intermediate_size=256)
    deploy["data"].update(n_train=64, n_test=16)
    deploy["steps"][0]["params"]["epochs"] = 1
    deploy["steps"][2]["params"]["num_batches"] = 2
    monkeypatch.chdir(tmp_path)
    assert ml.run_pipeline(deploy).report["status"] == "ok"
    lines = [line for line in command_lines(page) if line[:1] == ["export"] and "runs/w4a16" in line[1]]
    assert {"onnx", "pt2"} <= {line[3] for line in lines}
    for argv in lines:
        assert main(argv) == 0 and (tmp_path / argv[-1]).exists()


def test_the_real_model_guide_runs_on_a_small_gguf(tmp_path, monkeypatch):
    """The real-model guide runs as written: its task file and its one JSON, with the file names they use, on a
    small Llama written as a GGUF beside them; the exports it names load back."""
    pytest.importorskip("lm_eval", reason="the eval extra is part of the dev extra")
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from mase_lite.deploy import export
    from mase_lite.importers import hub
    from mase_lite.workloads.tokenizer import train_wordpiece

    guide = dict(BLOCKS["real-model.md"])
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))) + " ." for _ in range(2500)]
    (tmp_path / "calibration.txt").write_text("\n".join(lines) + "\n")
    tokenizer = train_wordpiece(lines, vocab_size=60)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=512))
    export(model.eval(), "gguf", tmp_path / "model.gguf", tokenizer=tokenizer)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "text_cloze.yaml").write_text(guide["yaml"])
    cloze = [{"context": " ".join(line.split()[:4]), "endings": [" ".join(lines[j].split()[4:]) for j in (i, i + 1)],
              "answer": 0} for i, line in enumerate(lines[:12])]
    (tmp_path / "tasks" / "text_cloze.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cloze))
    (tmp_path / "smollm2-w4.json").write_text(guide["json"])
    monkeypatch.chdir(tmp_path)
    (argv,) = command_lines(BLOCKS["real-model.md"])
    assert argv == ["run", "smollm2-w4.json"]
    assert main(argv) == 0
    run = tmp_path / "runs" / "smollm2-w4"
    metrics = json.loads((run / "report.json").read_text())["metrics"]
    assert metrics["float_ppl"]["protocol"] == "chunks" and metrics["gptq_ppl"]["perplexity"] > 1
    assert set(metrics["gptq"]["text_cloze"]) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    back = hub.read_model(run / "model-Q4_0.gguf", AutoModelForCausalLM)
    assert back.mase_transforms[0]["params"]["rules"]  # read back as the 4-bit format it was written in
    config = json.loads((run / "model-w4" / "config.json").read_text())
    assert config["quantization_config"]["format"] == "pack-quantized"
    assert (run / "model-w4" / "tokenizer.json").is_file()
