import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import PATIENCE

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    "script, expected",
    [
        ("count_dropout.py", "6 dropout nodes: bert_embeddings_dropout, bert_encoder_layer_0_attention_output_dropout"),
        ("remove_dropout.py", "removed 6 dropout nodes; 0 left"),
    ],
)
def test_course_examples_run(script, expected):
    proc = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=PATIENCE)
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout
