"""Each search parameter type carries its behaviour: how Optuna samples it, its grid, its checked candidates, constness."""

import pytest

from mase_lite.infra.errors import UserError
from mase_lite.search.spec import SearchSpec


class Trial:
    """Records the suggest calls and answers with the first choice or the low bound."""

    def __init__(self):
        self.calls = []

    def suggest_categorical(self, name, choices):
        self.calls.append(("categorical", name, choices))
        return choices[0]

    def suggest_int(self, name, low, high, step=1, log=False):
        self.calls.append(("int", name, low, high, step, log))
        return low

    def suggest_float(self, name, low, high, step=None, log=False):
        self.calls.append(("float", name, low, high, step, log))
        return low


def entry(**fields):
    spec = {"pipeline": {}, "space": [{"path": "seed", **fields}], "objectives": [{"metric": "a.b"}]}
    return SearchSpec.model_validate(spec).space[0]


def test_each_type_suggests_lists_its_grid_and_its_candidates():
    cases = [
        (dict(type="choice", values=[4, 8]), ("categorical", "p", [4, 8]), [4, 8], [(("values", 0), 4), (("values", 1), 8)]),
        (dict(type="choice", values=[{"w": 4}, {"w": 8}]), ("categorical", "p", [0, 1]), [0, 1],
         [(("values", 0), {"w": 4}), (("values", 1), {"w": 8})]),
        (dict(type="int", low=2, high=8, step=3), ("int", "p", 2, 8, 3, False), [2, 5, 8], [(("low",), 2), (("high",), 8)]),
        (dict(type="float", low=0.5, high=1.5, step=0.5), ("float", "p", 0.5, 1.5, 0.5, False), [0.5, 1.0, 1.5],
         [(("low",), 0.5), (("high",), 1.5)]),
        (dict(type="log_float", low=1e-3, high=1e-1), ("float", "p", 1e-3, 1e-1, None, True), None,
         [(("low",), 1e-3), (("high",), 1e-1)]),
    ]
    for fields, call, grid, candidates in cases:
        param, trial = entry(**fields), Trial()
        first = param.suggest(trial, "p")
        assert trial.calls == [call] and param.sampled and not param.fixed
        assert first == (fields["values"][0] if "values" in fields else fields["low"])
        assert param.candidates() == candidates
        if grid is None:
            with pytest.raises(UserError, match="the grid sampler needs choices, unlogged ints or floats with a step"):
                param.grid_values()
        else:
            assert param.grid_values() == grid and param.grid_count() == len(grid)


def test_include_and_const_entries():
    include = entry(path="steps.0.params.targets", type="include", nodes={"op": "linear"})
    trial = Trial()
    assert include.suggest(trial, "keep") is False and trial.calls == [("categorical", "keep", [False, True])]
    assert include.grid_values() == [False, True] and include.candidates() == [(("nodes",), True)]
    const = entry(type="const", value=3)
    assert not const.sampled and const.fixed and const.candidates() == [(("value",), 3)]


def test_an_entry_with_one_value_is_the_same_in_every_trial():
    assert entry(type="choice", values=[4, 4]).fixed and entry(type="int", low=3, high=3).fixed
    assert not entry(type="int", low=3, high=4, log=True).fixed
    with pytest.raises(UserError):
        entry(type="int", low=1, high=8, log=True).grid_count()
