"""The lm_eval step runs lm-evaluation-harness tasks on the run's model: on the float model its metrics equal those of
lm-eval's own HF model class (multiple choice, rolling loglikelihood and generate_until, each a task written here on
local JSON files); a packed model is scored packed and left as it was; the metrics serve a search's objectives; a
wrong task, folder or setting exits 2 naming the field, and a task file's Python code runs only when trusted."""

import copy
import json
import sys

import pytest
import torch

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.workloads import lm_harness
from mase_lite.infra.trust import set_trust_code

pytest.importorskip("lm_eval", reason="the eval extra (pip install 'mase-lite[eval]') is part of the dev extra")

LM = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64, "tie_word_embeddings": True}
TASKS = ["toy_choice", "toy_text", "toy_complete"]


def _json_task(folder, name, rows, split, body):
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                         f"    {split}: {folder / name}.jsonl\n{split}_split: {split}\n{body}")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    """A multiple-choice, a rolling-loglikelihood and a generate_until task, in lm-eval's task YAML."""
    folder = tmp_path_factory.mktemp("tasks")
    words = ["small", "big", "old", "young", "red", "happy"]
    _json_task(folder, "toy_choice", [{"question": f"the {w} dog", "choices": ["runs", "sleeps", "the cat"],
                                       "answer": i % 3} for i, w in enumerate(words)], "validation",
               'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
               "doc_to_target: answer\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    _json_task(folder, "toy_text", [{"text": f"the {w} dog runs to the big house ."} for w in words[:3]], "test",
               'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n'
               "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    _json_task(folder, "toy_complete", [{"prompt": f"the {w} dog", "target": "runs"} for w in words[:2]], "test",
               'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{target}}"\n'
               'generation_kwargs:\n  until: ["."]\n  max_gen_toks: 6\n  do_sample: false\n'
               "metric_list:\n  - metric: exact_match\n")
    return folder


GRAMMAR = {"dataset": "synthetic-grammar", "n_train": 4, "n_test": 6, "block_size": 16}


def spec(tmp_path, steps, data=GRAMMAR, **model) -> dict:
    return {"name": "lme", "seed": 0, "device": "cpu", "model": {"task": "causal-lm", "hf_config": LM, **model},
            "data": data, "steps": steps, "output_dir": str(tmp_path / "out")}


def lm_eval(task_dir, **params) -> dict:
    return {"pass": "lm_eval", "params": {"tasks": TASKS, "task_dir": str(task_dir), "batch_size": 4, **params}}


PACKED = {"pass": "quantize", "params": {"by": "type", "default": {"name": None},
                                         "linear": {"name": "mxint", "element_width": 8, "storage": "packed"}}}
FAKE = {"pass": "quantize", "params": {"by": "type", "default": {"name": None},
                                       "linear": {"weight": {"name": "mxint", "element_width": 8}}}}


def test_the_step_equals_lm_evals_own_hf_model_on_the_float_model(tmp_path, task_dir):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    result = ml.run_pipeline(spec(tmp_path, [lm_eval(task_dir)]))
    ours = result.report["metrics"]["lm_eval"]
    theirs = simple_evaluate(model=HFLM(pretrained=result.mg.source_model, tokenizer=copy.deepcopy(result.data.tokenizer),
                                        batch_size=4),
                             tasks=TASKS, task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
                             bootstrap_iters=1000, log_samples=False)["results"]
    expected = {task: {lm_harness.metric_name(k): v for k, v in results.items()
                       if lm_harness.metric_name(k) and isinstance(v, float)} for task, results in theirs.items()}
    assert set(ours) == set(TASKS) and {t: set(m) for t, m in ours.items()} == {t: set(m) for t, m in expected.items()}
    assert set(ours["toy_choice"]) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    assert set(ours["toy_text"]) == {"word_perplexity", "byte_perplexity", "bits_per_byte"}
    for task in TASKS:  # the captured graph's logits against the module's: equal up to float32 rounding
        assert ours[task] == pytest.approx(expected[task], rel=1e-6), task
    assert ours["toy_text"]["word_perplexity"] > 1
    about = next(s for s in result.report["steps"] if s.get("pass") == "lm_eval")["info"]["tasks"]
    assert about["toy_choice"] == {"documents": 6, "num_fewshot": 0, "higher_is_better": {"acc": True, "acc_norm": True}}


def test_limit_and_fewshot_reach_lm_eval(tmp_path, task_dir):
    result = ml.run_pipeline(spec(tmp_path, [lm_eval(task_dir, tasks=["toy_choice"], limit=2, num_fewshot=1)]))
    about = next(s for s in result.report["steps"] if s.get("pass") == "lm_eval")["info"]["tasks"]
    assert about["toy_choice"]["documents"] == 2 and about["toy_choice"]["num_fewshot"] == 1


def test_a_packed_model_is_scored_packed_and_left_as_it_was(tmp_path, task_dir):
    fake = ml.run_pipeline(spec(tmp_path / "fake", [FAKE, lm_eval(task_dir, tasks=["toy_text"])]))
    packed = ml.run_pipeline(spec(tmp_path / "packed", [PACKED]))
    model = packed.mg.source_model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert "lm_head.codes" in before and "lm_head.weight" not in before  # the tied head is packed too
    _, info = ml.passes.lm_eval(packed.mg, lm_eval(task_dir, tasks=["toy_text"])["params"], data=packed.data)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert model.training is False or model.training == packed.mg.model.training
    # MXINT8 weights: the packed kernels compute what fake quantization does, up to the order of float sums
    assert info["metrics"]["toy_text"] == pytest.approx(fake.report["metrics"]["lm_eval"]["toy_text"], rel=1e-4)


def test_its_metrics_are_a_searchs_objectives(tmp_path, task_dir, capsys):
    pipeline = spec(tmp_path, [lm_eval(task_dir, tasks=["toy_choice"], limit=3)])
    search = {"pipeline": pipeline, "space": [{"path": "steps.lm_eval.params.limit", "type": "choice", "values": [2, 3]}],
              "objectives": [{"metric": "lm_eval.toy_chioce.acc"}], "sampler": {"name": "grid", "seed": 0},
              "n_trials": 2, "output_dir": str(tmp_path / "search")}
    (tmp_path / "bad.json").write_text(json.dumps(search))
    assert main(["search", str(tmp_path / "bad.json")]) == 2 and not (tmp_path / "search").exists()
    assert ("objectives.0.metric: 'lm_eval.toy_chioce.acc' is not a metric the pipeline reports (did you mean "
            "'lm_eval.toy_choice.*'?)") in capsys.readouterr().err
    search["objectives"] = [{"metric": "lm_eval.toy_choice.acc"}]
    (tmp_path / "good.json").write_text(json.dumps(search))
    assert main(["search", str(tmp_path / "good.json")]) == 0
    trials = json.loads((tmp_path / "search" / "search_report.json").read_text())["studies"][0]["trials"]
    assert len(trials) == 2 and all(0 <= t["values"][0] <= 1 for t in trials)


def _refused(tmp_path, capsys, steps, *flags, **settings) -> str:
    (tmp_path / "spec.json").write_text(json.dumps(spec(tmp_path, steps, **settings)))
    code = main(["run", str(tmp_path / "spec.json"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    return err


def test_wrong_settings_exit_2_naming_the_field(tmp_path, task_dir, capsys):
    err = _refused(tmp_path, capsys, [lm_eval(task_dir, tasks=["toy_choice", "toy_chioce"])])
    assert "steps.0.params.tasks: 'toy_chioce' is not an lm-eval task or group (did you mean 'toy_choice'" in err
    assert not (tmp_path / "out").exists()  # found when the spec was read, before the run
    err = _refused(tmp_path, capsys, [lm_eval(tmp_path / "nowhere")])
    assert f"steps.0.params.task_dir: {tmp_path / 'nowhere'} is not a folder of lm-eval task YAML files" in err
    assert "steps.0.params.chat: the run's tokenizer has no chat template" in _refused(
        tmp_path, capsys, [lm_eval(task_dir, chat=True)])
    assert "lm_eval scores a causal language model with the run's tokenizer; this run's task is " \
           "sequence-classification" in _refused(
               tmp_path, capsys, [lm_eval(task_dir)], task="sequence-classification",
               data={"dataset": "synthetic-sentiment", "n_train": 8, "n_test": 8, "max_length": 16},
               hf_config={"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                          "intermediate_size": 64})


def test_without_the_extra_the_step_names_it(tmp_path, task_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    lm_harness._manager.cache_clear()
    err = _refused(tmp_path, capsys, [lm_eval(task_dir)])
    assert "the lm_eval step needs lm-evaluation-harness (lm_eval is missing): pip install 'mase-lite[eval]'" in err


def test_a_task_files_python_runs_only_when_trusted(tmp_path, capsys):
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "utils.py").write_text("import pathlib\npathlib.Path(__file__).with_name('imported').touch()\n\n"
                                     "def first_two(docs):\n    return docs.select(range(2))\n")
    _json_task(folder, "coded", [{"text": f"the dog {i}"} for i in range(5)], "test",
               'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
               "process_docs: !function utils.first_two\nmetric_list:\n  - metric: word_perplexity\n")
    step = {"pass": "lm_eval", "params": {"tasks": ["coded"], "task_dir": str(folder)}}
    err = _refused(tmp_path, capsys, [step])
    assert ("steps.0.params.task_dir: coded.yaml:10 names Python code (process_docs: !function utils.first_two); it "
            "is not imported unless you trust the file's code with --trust-code") in err
    assert not (folder / "imported").exists()
    (tmp_path / "spec.json").write_text(json.dumps(spec(tmp_path, [step])))
    try:
        assert main(["--trust-code", "run", str(tmp_path / "spec.json")]) == 0
    finally:
        set_trust_code(False)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    about = next(s for s in report["steps"] if s.get("pass") == "lm_eval")["info"]["tasks"]
    assert (folder / "imported").exists() and about["coded"]["documents"] == 2
