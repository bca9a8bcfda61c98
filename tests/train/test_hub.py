import socket
from pathlib import Path

import datasets.config
import huggingface_hub.constants
import pytest

from mase_lite.workloads import hub


@pytest.fixture
def no_hf_env(monkeypatch):
    for var in hub.CACHE_VARIABLES + hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(var, raising=False)


def test_cache_goes_under_the_run_unless_told_otherwise(no_hf_env, monkeypatch, tmp_path):
    assert hub.hub_cache_dir(None, tmp_path / "run") == tmp_path / "run" / "hf_cache"
    assert hub.hub_cache_dir("/data/hf", tmp_path / "run") == Path("/data/hf")
    monkeypatch.chdir(tmp_path)
    assert hub.hub_cache_dir(None, None) == tmp_path / "hf_cache"
    monkeypatch.setenv("HF_HOME", "/somewhere/chosen")
    assert hub.hub_cache_dir(None, tmp_path / "run") is None


def test_offline_variables_skip_the_network(no_hf_env, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("opened a connection")

    monkeypatch.setattr(socket, "create_connection", forbidden)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert hub.offline_requested() and not hub.hub_reachable()


def test_unreachable_hub_sets_offline_mode_only_inside_the_block(no_hf_env, monkeypatch):
    def refuse(address, timeout):
        assert address == ("hub.example", 8443) and timeout == hub.PROBE_TIMEOUT_S
        raise OSError("no route to host")

    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example:8443/")
    monkeypatch.setattr(socket, "create_connection", refuse)
    flags = [(huggingface_hub.constants, "HF_HUB_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"),
             (datasets.config, "HF_DATASETS_OFFLINE")]
    for module, name in flags:
        monkeypatch.setattr(module, name, False)
    with hub.hub_access() as online:
        assert online is False
        assert all(getattr(module, name) is True for module, name in flags)
    assert all(getattr(module, name) is False for module, name in flags)
