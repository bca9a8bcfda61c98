import json
from pathlib import Path

import jsonschema
import pytest

from mase_lite import UserError
from mase_lite.pipeline.spec import PipelineSpec, check_pipeline, load_spec, pipeline_schema
from tests.schemas import validator

PIPELINES = sorted(Path(__file__).resolve().parents[2].joinpath("pipelines").glob("*.json"))


def test_there_are_shipped_pipelines():
    assert "quickstart.json" in [p.name for p in PIPELINES]


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_schema_validates_every_shipped_pipeline(path):
    validator("pipeline").validate(json.loads(path.read_text()))


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_every_shipped_pipeline_checks(path):
    check_pipeline(load_spec(path))


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_round_trip(path):
    spec = load_spec(path)
    dumped = json.loads(json.dumps(spec.model_dump(mode="json", by_alias=True)))
    assert load_spec(dumped) == spec
    assert dumped["steps"][0]["pass"] == spec.steps[0].pass_name


def test_schema_rejects_unknown_top_level_key():
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"steps": [], "stepz": []}, pipeline_schema())


def test_unknown_key_names_path_and_allowed_keys():
    with pytest.raises(UserError, match=r"stepz: unknown key; allowed keys: capture, data, device, example_inputs, inputs, model, name, output_dir, plugins, seed, steps, verify_each"):
        load_spec({"stepz": []})


def test_unknown_step_key():
    with pytest.raises(UserError, match=r"steps.0.parms: unknown key; allowed keys: draw_after, label, params, pass"):
        load_spec({"steps": [{"pass": "count", "parms": {}}]})


def test_wrong_type_names_path_and_value():
    with pytest.raises(UserError, match=r"seed: Input should be a valid integer.*\(got 'zero'\)"):
        load_spec({"seed": "zero"})


def test_invalid_json_names_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "name": "x",\n  "steps": [\n}')
    with pytest.raises(UserError, match=r"bad.json: not valid JSON at line 4, column 1"):
        load_spec(path)


def test_missing_file():
    with pytest.raises(UserError, match=r"no such spec file: nowhere.json"):
        load_spec("nowhere.json")


def test_check_reports_every_problem_with_paths():
    with pytest.raises(UserError) as err:
        load_spec(
            {
                "steps": [
                    {"pass": "cuont"},
                    {"pass": "count", "params": {"dimz": {}}},
                    {"pass": "profile", "params": {"num_batches": 0}},
                ]
            }
        )
    text = str(err.value)
    assert "steps.0.pass: unknown pass 'cuont' (did you mean 'count'?); registered passes: " in text
    assert "steps.1.params.dimz: unknown key; allowed keys: dims" in text
    assert "steps.2.params.num_batches: Input should be greater than or equal to 1 (got 0)" in text


def test_requirement_not_provided_names_the_provider():
    from mase_lite.passes import PassParams, register_pass

    register_pass("test_needs_profile", kind="analysis", requires=("profile",))(lambda mg, p: (mg, {}))
    spec = load_spec({"steps": [{"pass": "test_needs_profile"}, {"pass": "profile"}]})
    with pytest.raises(UserError, match=r"steps.0 \(test_needs_profile\) needs 'profile', which no earlier step provides \(or a transform since invalidated\); run one of: profile before it"):
        check_pipeline(spec)
    check_pipeline(load_spec({"steps": [{"pass": "profile"}, {"pass": "test_needs_profile"}]}))
    with pytest.raises(UserError, match=r"steps.0 \(profile\) needs 'data'.*give the pipeline a `data` section"):
        check_pipeline(load_spec({"data": None, "steps": [{"pass": "profile"}]}))


def test_report_json_is_accepted_as_a_spec():
    spec = load_spec({"name": "x"})
    report = {"spec": spec.model_dump(mode="json", by_alias=True), "versions": {}}
    reproduced = load_spec(report)
    assert reproduced.model_dump() == spec.model_dump() and reproduced.recorded and not spec.recorded


def test_a_formats_unknown_key_names_the_formats_keys_and_the_nearest():
    spec = {"steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"linear": {"weight": {"name": "scaled_integer", "widht": 4}}}}}]}
    with pytest.raises(UserError, match=r"steps.0.params.rules.linear.weight.widht: unknown key for format 'scaled_integer'; "
                                        r"did you mean 'width'\? allowed keys: clip, full_range, granularity, group_size, "
                                        r"scale, scale_dtype, symmetric, width \(got 4\)"):
        load_spec(spec)
