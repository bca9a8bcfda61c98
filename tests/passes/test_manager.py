"""The pass manager's contract, enforced in one place for every call."""

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from pydantic import BaseModel

import mase_lite as ml
from mase_lite.passes import PassContext, PassError, PassInstrument, PassResult, instrument, register_pass
from mase_lite.passes.instruments import Timing, VerifyAfterEach
from mase_lite.passes.manager import PassContractError, ReadOnlyParamsError
from mase_lite.pipeline.spec import check_pipeline, load_spec, pipeline_schema
from tests.ir.models import TwiceMLP

SMALL_DATA = {"dataset": "synthetic-sentiment", "n_train": 32, "n_test": 16}


def mlp():
    torch.manual_seed(0)
    return ml.MaseGraph(TwiceMLP(), example_inputs={"x": torch.randn(2, 16)})


@register_pass("test_add_relu_no_recompile", kind="transform")
def add_relu_no_recompile(mg, params):
    """Append a relu after the output layer and forget mg.recompile()."""
    out = next(n for n in mg.nodes if n.name == "out")
    with mg.model.graph.inserting_after(out):
        relu = mg.model.graph.call_function(torch.relu, (out,))
    out.replace_all_uses_with(relu)
    relu.args = (out,)
    return PassResult()


class TagParams(BaseModel):  # a plain pydantic model, as a third-party author writes it
    tags: list[str] = ["relu"]


@register_pass("test_mutating_tags", kind="analysis", params=TagParams)
def mutating_tags(mg, params):
    """Appends to its params: the search-loop bug the manager must stop."""
    params.tags.append("relu")
    return PassResult({"tags": list(params.tags)})


@register_pass("test_needs_profile_after", kind="analysis", requires=("profile",))
def needs_profile(mg, params):
    """Reads profile statistics."""
    return PassResult()


@register_pass("test_breaks_graph", kind="analysis")
def breaks_graph(mg, params):
    """Leaves a node whose metadata lacks its weight."""
    out = next(n for n in mg.nodes if n.name == "out")
    out.meta["mase"]["params"].pop("weight")
    return PassResult()


def test_a_forgotten_recompile_is_done_by_the_manager():
    mg = mlp()
    mg.model.eval()
    x = torch.randn(3, 16)
    before = mg.model(x=x)
    mg, _ = ml.passes.test_add_relu_no_recompile(mg)
    assert torch.equal(mg.model(x=x), torch.relu(before))
    assert ml.passes.verify(mg)[1]["ok"]


def test_verify_catches_stale_code():
    mg = mlp()
    add_relu_no_recompile.fn(mg, None)  # bypassing the manager leaves the old forward running
    _, info = ml.passes.verify(mg, {"strict": False})
    assert "the module's forward was generated from an older graph: call mg.recompile()" in info["problems"]


def test_params_reused_100_times_are_never_changed():
    params = ml.passes.test_mutating_tags.validate({"tags": ["relu"]})
    mg = mlp()
    for _ in range(100):
        with pytest.raises(ReadOnlyParamsError, match=r"^pass 'test_mutating_tags': params are read-only \(FrozenList\)"):
            ml.passes.test_mutating_tags(mg, params)
    assert params.tags == ["relu"]
    with pytest.raises(Exception, match="frozen"):
        params.tags = []


def test_requires_and_invalidates_name_the_passes():
    mg = mlp()
    with pytest.raises(PassError, match=r"pass 'test_needs_profile_after' needs 'profile', which the graph does not hold .*run one of: profile before it"):
        ml.passes.test_needs_profile_after(mg)
    mg.facts.add("profile")
    ml.passes.test_needs_profile_after(mg)
    mg, _ = ml.passes.remove_dropout(mg)
    assert "profile" not in mg.facts and {"graph", "metadata"} <= mg.facts
    with pytest.raises(PassError, match=r"needs 'profile'"):
        ml.passes.test_needs_profile_after(mg)


def test_pipeline_check_follows_invalidation():
    steps = [{"pass": "profile", "params": {"num_batches": 1}}, {"pass": "remove_dropout"}, {"pass": "test_needs_profile_after"}]
    with pytest.raises(ml.UserError, match=r"steps.2 \(test_needs_profile_after\) needs 'profile', which no earlier step provides \(or a transform since invalidated\); run one of: profile"):
        check_pipeline(load_spec({"data": SMALL_DATA, "steps": steps}))
    check_pipeline(load_spec({"data": SMALL_DATA, "steps": steps[1:2] + steps[:1] + steps[2:]}))


def test_runtime_errors_carry_the_step_path(tmp_path):
    spec = {
        "data": SMALL_DATA,
        "output_dir": str(tmp_path),
        "steps": [{"pass": "count"}, {"pass": "quantize", "params": {"by": "name", "rules": {"no_such_node": {"name": "integer", "width": 8, "frac_width": 4}}}}],
    }
    with pytest.raises(PassError, match=r"^steps\.1\.params\.rules\.no_such_node: matches no node \(by name\); quantizable nodes: "):
        ml.run_pipeline(spec)
    assert json.loads((tmp_path / "report.json").read_text())["failed_step"] == "steps.1 (quantize)"


def test_a_bug_in_a_pass_keeps_its_type_and_names_the_pass():
    @register_pass("test_raises_key_error", kind="analysis")
    def raises(mg, params):
        """Has a bug."""
        return {}["missing"]

    with pytest.raises(KeyError) as err:
        ml.passes.test_raises_key_error(mlp())
    assert "while running pass 'test_raises_key_error'" in err.value.__notes__


def test_verify_after_each_names_the_pass_that_broke_the_graph():
    with instrument(VerifyAfterEach()), pytest.raises(PassContractError, match=r"pass 'test_breaks_graph' left a graph that fails verification"):
        ml.passes.test_breaks_graph(mlp())


def test_instruments_see_every_call_with_its_record():
    class Names(PassInstrument):
        def __init__(self):
            self.seen = []

        def after_pass(self, run):
            self.seen.append((run.info.name, run.record["seconds"] >= 0))

    names = Names()
    with instrument(Timing(), names):
        mg, _ = ml.passes.count(mlp())
        ml.passes.remove_dropout(mg)
    ml.passes.count(mg)
    assert names.seen == [("count", True), ("remove_dropout", True)]


def test_context_path_resolves_against_the_output_dir(tmp_path):
    assert PassContext(output_dir=tmp_path).path("a/b.svg") == tmp_path / "a" / "b.svg"
    assert PassContext().path("a.svg").as_posix() == "a.svg"


def test_schema_describes_pass_params_and_format_fields():
    schema = pipeline_schema()
    spec = json.loads((Path(__file__).resolve().parents[2] / "pipelines" / "qat_int8.json").read_text())
    jsonschema.validate(spec, schema)
    bad = {"steps": [{"pass": "quantize", "params": {"rules": {"linear": {"weight": {"name": "integer", "width": 8, "frac_widht": 4}}}}}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    best = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(bad))
    assert "frac_widht" in best.message
    assert list(best.absolute_path)[:6] == ["steps", 0, "params", "rules", "linear", "weight"]
    with pytest.raises(ml.UserError, match=r"steps\.0\.params\.rules\.linear\.weight\.frac_widht: unknown key"):
        load_spec(bad)


def test_loading_a_graph_whose_pass_is_not_registered_names_its_module(tmp_path):
    @register_pass("test_temporary_transform", kind="transform")
    def temporary(mg, params):
        """Changes nothing."""
        return PassResult()

    mg, _ = ml.passes.test_temporary_transform(mlp())
    mg.save(tmp_path / "g")
    from mase_lite.passes import registry

    del registry._REGISTRY["test_temporary_transform"]
    with pytest.raises(ml.UserError, match=r"transforms\.0: this graph was saved after pass 'test_temporary_transform' from tests\.passes\.test_manager, which is not registered here; install the package that provides it, or name the module with --plugin"):
        ml.load(tmp_path / "g", model=TwiceMLP())
    with pytest.raises(ml.UserError, match=r"was saved after transforms \(test_temporary_transform\); load it with mase_lite\.load"):
        ml.MaseGraph.load(tmp_path / "g", model=TwiceMLP())


def test_a_run_imports_only_the_passes_it_names():
    import subprocess
    import sys

    code = (
        "import sys; from mase_lite.pipeline.spec import load_spec, check_pipeline;"
        "check_pipeline(load_spec({'steps': [{'pass': 'count'}, {'pass': 'verify'}]}));"
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('mase_lite.passes.transforms.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert "quantize" in ml.passes.all_passes() and ml.passes.get_pass("fuse_sdpa").kind == "transform"
