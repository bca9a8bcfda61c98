"""Reaching the Hugging Face hub without hanging and without filling the home directory.

Example::

    cache = hub_cache_dir(None, run_dir)          # run_dir / "hf_cache" unless HF_HOME & co. are set
    with hub_access() as online:                  # offline mode (cache only) when unreachable
        ds = datasets.load_dataset("imdb", cache_dir=str(cache))
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
CACHE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE")
PROBE_TIMEOUT_S = 3.0


def offline_requested() -> bool:
    """Whether the environment asks for offline mode (read now, not at import time)."""
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE_VARIABLES)


def hub_endpoint() -> str:
    """The hub's address (``HF_ENDPOINT`` or https://huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout`` seconds."""
    if offline_requested():
        return False
    url = urlparse(hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError as err:
        logger.info("the hub at %s is unreachable: %s", hub_endpoint(), err)
        return False


@contextmanager
def _overridden(settings: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set ``(object, attribute, value)`` triples for the duration of the block."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in settings]
    try:
        for obj, name, value in settings:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


@contextmanager
def hub_access() -> Iterator[bool]:
    """Yield whether the hub is reachable; when it is not, `datasets` and `transformers` run offline.

    Offline, the libraries read their caches and fail at once instead of retrying for a minute.
    """
    online = hub_reachable()
    if online:
        yield True
        return
    import datasets.config
    import huggingface_hub.constants

    offline = [
        (huggingface_hub.constants, "HF_HUB_OFFLINE", True),
        (datasets.config, "HF_HUB_OFFLINE", True),
        (datasets.config, "HF_DATASETS_OFFLINE", True),
    ]
    with _overridden(offline):
        yield False


def hub_cache_dir(explicit: str | Path | None, run_dir: Path | None) -> Path | None:
    """Where hub downloads go: the explicit option, else the library default when the user set
    ``HF_HOME``/``HF_HUB_CACHE``/``HF_DATASETS_CACHE``, else ``run_dir / "hf_cache"``."""
    if explicit is not None:
        return Path(explicit)
    if any(os.environ.get(v) for v in CACHE_VARIABLES):
        return None
    return (run_dir if run_dir is not None else Path.cwd()) / "hf_cache"
