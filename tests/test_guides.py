"""The real-model guide (docs/real-model.md) runs as written: its task file and its one JSON, with the file names
they use, on a small Llama written as a GGUF beside them; the exports it names load back."""

import json
import random
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from mase_lite.cli import main
from mase_lite.deploy import export, hub
from mase_lite.train.tokenizer import train_wordpiece

pytest.importorskip("lm_eval", reason="the eval extra is part of the dev extra")
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "real-model.md"
BLOCKS = dict(re.findall(r"^```(\w+)\n(.*?)^```", GUIDE.read_text(), re.S | re.M))

WORDS = "the a small big dog cat runs sleeps on under mat house".split()


def test_the_real_model_guide_runs_on_a_small_gguf(tmp_path, monkeypatch):
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
    (tmp_path / "tasks" / "text_cloze.yaml").write_text(BLOCKS["yaml"])
    cloze = [{"context": " ".join(line.split()[:4]), "endings": [" ".join(lines[j].split()[4:]) for j in (i, i + 1)],
              "answer": 0} for i, line in enumerate(lines[:12])]
    (tmp_path / "tasks" / "text_cloze.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cloze))
    (tmp_path / "smollm2-w4.json").write_text(BLOCKS["json"])
    monkeypatch.chdir(tmp_path)
    assert main(["run", "smollm2-w4.json"]) == 0
    run = tmp_path / "runs" / "smollm2-w4"
    metrics = json.loads((run / "report.json").read_text())["metrics"]
    assert metrics["float_ppl"]["protocol"] == "chunks" and metrics["gptq_ppl"]["perplexity"] > 1
    assert set(metrics["gptq"]["text_cloze"]) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    back = hub.read_model(run / "model-Q4_0.gguf", AutoModelForCausalLM)
    assert back.mase_transforms[0]["params"]["rules"]  # read back as the 4-bit format it was written in
    config = json.loads((run / "model-w4" / "config.json").read_text())
    assert config["quantization_config"]["format"] == "pack-quantized"
    assert (run / "model-w4" / "tokenizer.json").is_file()
