import pytest


@pytest.fixture(autouse=True)
def _cold(cold_capture_cache):
    """Tests of capture see every capture export (or load its on-disk entry) as a first capture does."""
