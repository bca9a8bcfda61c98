"""The on-disk export cache: a new process (here: an emptied in-process cache) loads the program an
earlier one exported, checks it against the model as a fresh export is, and recovers from bad entries."""

import logging
import os

import pytest
import torch

import mase_lite.ir.capture as capture_module
from mase_lite import MaseGraph
from mase_lite.ir import export_cache
from mase_lite.ir.capture_cache import CACHE
from tests.ir.test_capture_cache import NAMES, batch, bert, same


@pytest.fixture
def exports(monkeypatch, tmp_path):
    """The cache on, in a directory of this test; the number of real torch.export calls so far."""
    monkeypatch.setenv("MASE_LITE_EXPORT_CACHE", "1")
    monkeypatch.setenv("MASE_LITE_CACHE", str(tmp_path))
    calls = []
    real = capture_module.export_model

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(capture_module, "export_model", counted)
    return calls


def entries() -> list:
    return sorted(export_cache.directory().glob("*.pt2"))


def capture_fresh(model):
    """A capture as a new process does it: nothing in the in-process cache."""
    CACHE.clear()
    return MaseGraph(model, hf_input_names=NAMES)


def test_a_new_process_loads_the_stored_program_bit_exact_with_its_own_weights(exports):
    capture_fresh(bert(0))
    assert len(exports) == 1 and len(entries()) == 1
    oct_mode = entries()[0].stat().st_mode & 0o777
    assert oct_mode & 0o077 == 0  # this user's alone
    model = bert(1)
    mg = capture_fresh(model)
    assert len(exports) == 1  # loaded, not exported
    for b, s in [(2, 9), (3, 17)]:  # other batch and sequence sizes: the dims stayed dynamic
        inputs = batch(b, s, seed=s)
        with torch.no_grad():
            assert same(mg.model(**inputs), model(**inputs))


def test_a_damaged_entry_is_removed_with_a_warning_and_the_model_exported_again(exports, caplog):
    capture_fresh(bert(0))
    entries()[0].write_bytes(b"not a program")
    with caplog.at_level(logging.WARNING, logger="mase_lite.ir.export_cache"):
        model = bert(1)
        mg = capture_fresh(model)
    assert "does not load" in caplog.text and len(exports) == 2
    inputs = batch(2, 9)
    with torch.no_grad():
        assert same(mg.model(**inputs), model(**inputs))
    assert len(entries()) == 1 and entries()[0].stat().st_size > 1000  # stored again, whole


def test_a_stored_program_the_model_does_not_match_is_replaced(exports):
    capture_fresh(bert(0, num_attention_heads=4))
    wrong = entries()[0]
    model = bert(1, num_attention_heads=2)  # the same weights' shapes, another graph (its head reshapes)
    key = export_cache.entry_key(capture_module.architecture_key(model, _inputs(model), _dims(model), ()), model)
    os.replace(wrong, export_cache.directory() / f"{key}.pt2")  # the 4-head program under the 2-head model's key
    mg = capture_fresh(model)
    assert len(exports) == 2  # checked, refused, exported afresh
    inputs = batch(2, 9)
    with torch.no_grad():
        assert same(mg.model(**inputs), model(**inputs))


def test_a_stored_program_that_fails_to_run_on_the_model_is_removed_with_a_warning(exports, caplog):
    """Issue 48 item 9a: an entry whose shapes do not fit the model ended every capture in a traceback
    (``shape '[3, 13, -1, 24]' is invalid``) and stayed."""
    capture_fresh(bert(0, hidden_size=48))  # two heads of 24
    model = bert(1, hidden_size=32)
    key = export_cache.entry_key(capture_module.architecture_key(model, _inputs(model), _dims(model), ()), model)
    planted = export_cache.directory() / f"{key}.pt2"
    os.replace(entries()[0], planted)
    with caplog.at_level(logging.WARNING, logger="mase_lite.ir.capture"):
        mg = capture_fresh(model)
    assert f"the stored export {planted} does not fit" in caplog.text and "is invalid for input of size" in caplog.text
    inputs = batch(2, 9)
    with torch.no_grad():
        assert same(mg.model(**inputs), model(**inputs))
    assert len(exports) == 2 and entries() == [planted]  # exported afresh and stored in its place
    capture_fresh(bert(2, hidden_size=32))
    assert len(exports) == 2  # the new entry loads


def test_a_directory_others_may_write_is_not_used(exports):
    export_cache.directory().mkdir(parents=True)
    export_cache.directory().chmod(0o777)
    capture_fresh(bert(0))
    capture_fresh(bert(1))
    assert len(exports) == 2 and entries() == []


def test_off_by_the_environment_and_for_large_models(exports, monkeypatch):
    monkeypatch.setenv("MASE_LITE_EXPORT_CACHE", "0")
    capture_fresh(bert(0))
    assert entries() == []
    monkeypatch.setenv("MASE_LITE_EXPORT_CACHE", "1")
    monkeypatch.setattr(export_cache, "MAX_PARAMETER_BYTES", 1000)
    capture_fresh(bert(0))
    assert entries() == [] and len(exports) == 2


def test_the_oldest_entries_go_beyond_the_limit(exports, monkeypatch):
    monkeypatch.setattr(export_cache, "MAX_ENTRIES", 2)
    for act in ("gelu", "relu", "silu"):
        capture_fresh(bert(0, hidden_act=act))
    assert len(entries()) == 2


def _inputs(model):
    from mase_lite.ir.inputs import hf_example_inputs

    return hf_example_inputs(model, NAMES)


def _dims(model):
    from mase_lite.ir.export import default_dynamic_shapes

    return default_dynamic_shapes(_inputs(model))


def test_no_home_directory_means_no_cache_and_a_working_capture(exports, monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("MASE_LITE_CACHE")

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    model = bert(0)
    mg = capture_fresh(model)
    inputs = batch(2, 9)
    with torch.no_grad():
        assert same(mg.model(**inputs), model(**inputs))
    assert len(exports) == 1
