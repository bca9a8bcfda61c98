"""The prefix cache: trials that share their first steps reuse the state after them.

A search whose space touches only steps ``k`` and later (the usual case: train once, then quantize,
prune and evaluate many ways) runs those first ``k`` steps once. The state after them (the graph,
the run's data, the random generators of torch, python and numpy, and the steps' report entries)
is kept in memory for this worker and written to ``<output_dir>/cache/<key>/`` for every worker that
sees the directory: the graph as ``mg.save`` writes it (safetensors + JSON), the generators as
safetensors + JSON. The key hashes the canonical JSON of everything the state depends on: model,
data, seed, inputs, plug-ins and the first ``k`` steps. An entry's files are listed with their checksums,
signed with this user's key (:mod:`mase_lite.infra.signing`): an entry another user wrote, or copied from someone
else's search directory, is not trusted but discarded and computed again. A trial restored from the cache
reports exactly the metrics of a run without it; its restored steps say ``"cached": true`` in report.json.
Files the cached steps wrote (a drawing, a checkpoint) exist only in the trial that ran them.

Example::

    k = prefix_length(pipeline_dict, space)          # None: the space varies the model, data or seed
    cache = PrefixCache(Path("runs/s/cache"), k)
    run_pipeline(trial_pipeline, cache=cache)        # the first trial runs steps 0..k-1 and stores
    run_pipeline(other_trial_pipeline, cache=cache)  # later trials start at step k
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict
from safetensors.torch import load_file, save_file

from mase_lite.infra.errors import UserError
from mase_lite.infra.files import follow_umask, private, temp_dir
from mase_lite.passes.manager import BASE_FACTS, PassContext
from mase_lite.passes.registry import PassError, get_pass
from mase_lite.infra.signing import sign, user_key, verify

logger = logging.getLogger(__name__)

FORMAT = 2
GRAPH, RNG, STATE, CHECKSUMS = "graph", "rng.safetensors", "state.json", "checksums.json"
UNKEYED = ("name", "output_dir", "steps")  # pipeline fields the state after a prefix does not depend on


def prefix_length(pipeline: dict, space) -> int | None:
    """How many leading steps of ``pipeline`` no entry of ``space`` changes; ``None`` when an entry varies
    something every step depends on (model, data, seed, inputs).

    The prefix also ends before a step that draws (``draw_after``) or leaves facts on the graph that a
    saved graph does not keep (such as ``profile``'s statistics).

    >>> from types import SimpleNamespace as NS
    >>> steps = [{"pass": "train"}, {"pass": "quantize"}, {"pass": "evaluate"}]
    >>> prefix_length({"steps": steps}, NS(entries=[NS()], keys=[["steps", 1, "params", "rules"]]))
    1
    >>> print(prefix_length({"steps": steps}, NS(entries=[NS()], keys=[["model", "hf_config", "hidden_size"]])))
    None
    """
    steps = pipeline.get("steps") or []
    k = len(steps)
    tied = getattr(space, "tied", None) or [[] for _ in space.entries]  # other paths an entry also sets
    for entry, keys, also in zip(space.entries, space.keys, tied):
        if getattr(entry, "fixed", False):
            continue  # the same in every trial
        for path in [keys, *(p for p, _ in also)]:
            if path[0] == "steps":
                k = min(k, path[1])
            elif path[0] not in UNKEYED:
                return None
    for i, step in enumerate(steps[:k]):
        try:
            provides = set(get_pass(step.get("pass", "")).provides)
        except PassError:
            return i
        if step.get("draw_after") or provides - BASE_FACTS:
            return i
    return k


def prefix_key(spec, k: int) -> str:
    """A digest of the canonical JSON of what the state after ``spec``'s first ``k`` steps depends on."""
    dumped = spec.model_dump(mode="json", by_alias=True)
    parts = {name: value for name, value in dumped.items() if name not in UNKEYED}
    parts["steps"] = dumped["steps"][:k]
    from mase_lite import __version__

    parts["versions"] = [FORMAT, __version__, torch.__version__]
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The random generators' states as tensors and JSON: torch (CPU and every CUDA device), python, numpy."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    version, words, gauss = random.getstate()
    plain: dict[str, Any] = {"python": [version, list(words), gauss]}
    try:
        import numpy
    except ImportError:
        return tensors, plain
    name, keys, pos, has_gauss, cached = numpy.random.get_state()
    tensors["numpy"] = torch.from_numpy(keys.astype("int64"))
    plain["numpy"] = [name, int(pos), int(has_gauss), float(cached)]
    return tensors, plain


def set_rng_state(tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> None:
    """Put back what :func:`rng_state` took."""
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, words, gauss = plain["python"]
    random.setstate((version, tuple(words), gauss))
    if "numpy" in plain:
        import numpy

        name, pos, has_gauss, cached = plain["numpy"]
        numpy.random.set_state((name, tensors["numpy"].numpy().astype("uint32"), pos, has_gauss, cached))


class StateFile(BaseModel):
    """``state.json`` of a cache entry: what the state after the prefix holds besides the graph and generators."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal[FORMAT]
    steps: int
    entries: list[dict[str, Any]]
    facts: list[str]
    training: bool
    device: str
    data_fingerprint: str | None
    rng: dict[str, Any]


def _checksums(directory: Path) -> dict[str, str]:
    """SHA-256 of each file under ``directory`` (but the checksum file) by relative path; anything but a
    regular file or a directory (a FIFO would hang the reader) is refused with a ``ValueError``."""
    sums = {}
    for path in sorted(directory.rglob("*")):
        if path.is_dir():
            continue
        if not path.is_file() or path.is_symlink():
            raise ValueError(f"{path} is not a regular file")
        name = path.relative_to(directory).as_posix()
        if name != CHECKSUMS:
            with path.open("rb") as f:
                sums[name] = hashlib.file_digest(f, "sha256").hexdigest()
    return sums


def _signed(key: str, sums: dict[str, str]) -> bytes:
    """What an entry's signature covers: its key and its files' checksums."""
    return json.dumps([key, sums], sort_keys=True).encode()


def seal(directory: Path, key: str, secret: bytes) -> None:
    """Write the checksums of the entry ``key``'s files in ``directory``, signed with ``secret``."""
    sums = _checksums(directory)
    (directory / CHECKSUMS).write_text(json.dumps({"files": sums, "signature": sign(secret, _signed(key, sums))}))


def check_seal(directory: Path, key: str, secret: bytes) -> None:
    """Raise a ``ValueError`` unless ``directory``'s files are those whose checksums ``secret`` signed for ``key``."""
    sealed = json.loads((directory / CHECKSUMS).read_bytes())
    sums = _checksums(directory)
    if not isinstance(sealed, dict) or sealed.get("files") != sums:
        raise ValueError("its files do not match their checksums")
    if not verify(secret, _signed(key, sums), sealed.get("signature")):
        raise ValueError("it is not signed with this user's key: another user wrote it, or it was copied in")


@dataclass
class _State:
    """The state after a prefix, as this worker holds it (never handed out: trials get copies)."""

    mg: Any
    data: Any
    entries: list[dict[str, Any]]
    rng: tuple[dict[str, torch.Tensor], dict[str, Any]]


def _copy_graph(mg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's pytree specs warn when copied
        return copy.deepcopy(mg)


def _device(mg) -> str:
    return str(next(mg.model.parameters(), torch.empty(0)).device)


def _fingerprint(data) -> str | None:
    return getattr(data, "fingerprint", None)


class PrefixCache:
    """The runner's step cache for one prefix length (see the module docstring).

    Several workers may share ``root``: a state is written to a staging directory and renamed into
    place; when two workers compute the same prefix at once, the first rename wins and the other
    worker's copy is discarded. ``keep`` states stay in memory (trials get deep copies). Without a
    signing key (:func:`mase_lite.infra.signing.user_key`), states stay in memory only.
    """

    def __init__(self, root: str | Path, length: int, keep: int = 2):
        self.root = Path(root)
        self.length = length
        self.keep = keep
        self._memory: OrderedDict[str, _State] = OrderedDict()
        self._data: dict[str, Any] = {}

    @functools.cached_property
    def _secret(self) -> bytes | None:
        return user_key()

    def restore(self, spec, ctx: PassContext) -> tuple[int, Any, list[dict[str, Any]]] | None:
        """The state after the prefix (a copy), with ``ctx.data`` and the generators set; ``None`` on a miss."""
        key = prefix_key(spec, self.length)
        state = self._memory.get(key) or self._load(key, spec, ctx)
        if state is None:
            return None
        self._remember(key, state)
        mg = _copy_graph(state.mg)
        ctx.data = state.data
        set_rng_state(*state.rng)
        logger.info("steps 0..%d restored from the prefix cache (%s)", self.length - 1, key)
        return self.length, mg, copy.deepcopy(state.entries)

    def store(self, spec, done: int, mg, entries: list[dict[str, Any]], ctx: PassContext) -> None:
        """Keep the state when ``done`` is the prefix length: in memory, and on disk unless another worker has."""
        if done != self.length:
            return
        from mase_lite.pipeline.runner import json_safe

        key = prefix_key(spec, done)
        try:
            state = _State(_copy_graph(mg), ctx.data, json_safe(entries), rng_state())
        except (TypeError, RuntimeError, copy.Error) as err:  # a pass left something that cannot be copied
            logger.warning("prefix cache: cannot copy the graph after %d steps (%s); not cached", done, err)
            return
        self._remember(key, state)
        if self._secret is not None and not (self.root / key).exists():
            try:
                self._write(key, mg, state)
            except (OSError, RuntimeError, TypeError, ValueError, UserError) as err:
                logger.warning("prefix cache: could not write %s: %s: %s", self.root / key, type(err).__name__, err)

    def _remember(self, key: str, state: _State) -> None:
        self._memory[key] = state
        self._memory.move_to_end(key)
        while len(self._memory) > self.keep:
            self._memory.popitem(last=False)

    def _write(self, key: str, mg, state: _State) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        staging = temp_dir(self.root, f".{key}.")
        try:
            mg.save(staging / GRAPH, weights="float")  # a later step may train: keep the float weights
            tensors, plain = state.rng
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(staging / RNG))
            follow_umask(staging / RNG)
            meta = StateFile(
                format=FORMAT, steps=self.length, entries=state.entries, facts=sorted(mg.facts),
                training=mg.model.training, device=_device(mg), data_fingerprint=_fingerprint(state.data), rng=plain,
            )
            (staging / STATE).write_text(meta.model_dump_json())
            seal(staging, key, self._secret)  # last: an entry with its checksums is whole
            try:
                os.rename(staging, self.root / key)
            except OSError:
                if not (self.root / key / STATE).is_file():
                    raise  # not another worker's finished copy: a real failure
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _load(self, key: str, spec, ctx: PassContext) -> _State | None:
        """The state another worker (or an earlier run) wrote, or ``None``. Entries are read only from a cache
        directory this user alone may write; an entry that is damaged (its checksums, its state file, its graph),
        foreign (files of another user or writable by others, or not signed with this user's key), impossible (weights
        on a device this machine has not, or without data) or stale (its data changed) is discarded, to be written
        again."""
        from mase_lite.passes.replay import load_graph

        directory = self.root / key
        if self._secret is None or not directory.is_dir():
            return None
        if not private(self.root):
            logger.info("prefix cache %s is not this user's alone: its entries are not used", self.root)
            return None
        try:
            if not all(private(p) for p in (directory, *directory.rglob("*"))):
                raise ValueError("it holds files of another user, or files others may write")
            check_seal(directory, key, self._secret)
            meta = StateFile.model_validate_json((directory / STATE).read_bytes())
            if meta.steps != self.length:
                raise ValueError(f"it holds {meta.steps} steps, not {self.length}")
            if meta.device != "cpu" and not (meta.device.startswith("cuda") and torch.cuda.is_available()):
                raise ValueError(f"it claims its weights are on device {meta.device!r}")
        except Exception as err:  # missing, truncated, garbage or of another format
            return self._discard(directory, err)
        data = self._data_for(spec, ctx)  # the trial's own data: its errors are the trial's
        if _fingerprint(data) != meta.data_fingerprint:
            return self._discard(directory, "the data changed since it was written")
        try:
            mg = load_graph(directory / GRAPH)
            rng = (load_file(str(directory / RNG)), meta.rng)
            set_rng_state(*rng)  # the generators are set from it next anyway; a bad state fails here
            if any(t.is_meta for t in mg.model.state_dict().values()):
                raise ValueError("its graph holds tensors without data (device meta)")
            mg.facts = set(meta.facts)
            mg.model.train(meta.training)
            if meta.device != "cpu":
                mg.to(meta.device)  # saved from the device the prefix left the weights on
        except Exception as err:
            return self._discard(directory, err)
        return _State(mg, data, meta.entries, rng)

    def _discard(self, directory: Path, why: Any) -> None:
        """Move a bad entry out of the way (a worker reading it keeps its files) and remove it."""
        logger.warning("prefix cache: %s is discarded (%s); the prefix runs again and is stored anew", directory, why)
        aside = Path(tempfile.mkdtemp(prefix=f".{directory.name}.discarded-", dir=self.root))
        try:
            os.rename(directory, aside / "entry")
        except OSError:
            pass  # another worker discarded it first
        shutil.rmtree(aside, ignore_errors=True)
        return None

    def _data_for(self, spec, ctx: PassContext):
        """The run's data, built as the runner builds it (once per worker and data section)."""
        if spec.data is None:
            return None
        parts = spec.model_dump(mode="json", include={"model", "data", "seed"})
        key = json.dumps(parts, sort_keys=True, default=str)
        if key not in self._data:
            from mase_lite.workloads import prepare

            _, self._data[key] = prepare(spec.model, spec.data, ctx.output_dir, spec.seed)
        return self._data[key]
