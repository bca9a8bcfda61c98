"""What code a checkpoint or a report may name: only what the user registered, named or trusted.

A checkpoint's ``recipe.json`` and a report's recorded spec are data, possibly from someone else.
They may name a model factory (``"pkg.mod:fn"``), leaf-module classes and plug-ins; mase_lite
imports or calls such a name only when

* it is registered: :func:`register_factory` / :func:`register_leaf_module` in code the user runs,
  or an entry point in the group ``mase_lite.models`` / ``mase_lite.leaf_modules`` of an installed
  distribution (its value is the ``"pkg.mod:attr"`` name);
* its module is a plug-in the user named (``--plugin``, ``plugins`` in a spec the user runs), or
  the user's own spec names the factory;
* or the user trusts the file's code: ``--trust-code`` on the command line, ``trust_code=True``
  in the API, or inside ``with trusting():`` (the analogue of transformers' ``trust_remote_code``).

>>> @register_factory
... def tiny():
...     import torch
...     return torch.nn.Linear(2, 2)
>>> resolve_factory(f"{__name__}:tiny", "model.factory") is tiny
True
>>> resolve_factory("subprocess:run", "model.factory")
Traceback (most recent call last):
...
mase_lite.infra.errors.UserError: model.factory = 'subprocess:run' is not a registered model factory, so it is not imported; register it (mase_lite.infra.trust.register_factory or the entry-point group mase_lite.models), name its module with --plugin, or trust the file's code with --trust-code (trust_code=True)
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import re
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

from mase_lite.infra.errors import UserError, short

logger = logging.getLogger(__name__)

FACTORY_GROUP = "mase_lite.models"
LEAF_GROUP = "mase_lite.leaf_modules"
TRUST_HINT = "trust the file's code with --trust-code (trust_code=True)"
QUALNAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

_trust = [False]  # one flag for the process (threads of a search included)
_factories: dict[str, Callable[..., Any]] = {}
_leaf_modules: dict[str, type] = {}
_named: set[str] = set()          # factories named by a spec the user runs
_plugin_modules: set[str] = set()  # modules the user named as plug-ins

T = TypeVar("T")


def qualname(obj: Any) -> str:
    """``"module:qualified.name"`` of a function or class."""
    return f"{obj.__module__}:{obj.__qualname__}"


def register_factory(fn: T) -> T:
    """Let checkpoints and reports name ``fn`` (by ``"module:qualname"``) as their model factory."""
    _factories[qualname(fn)] = fn
    return fn


def register_leaf_module(cls: T) -> T:
    """Let checkpoints name ``cls`` among the leaf modules their graph was captured with."""
    _leaf_modules[qualname(cls)] = cls
    return cls


def name_factory(name: str) -> None:
    """Record that the user's own spec names the factory ``name`` (so its checkpoints load)."""
    _named.add(name)


def name_plugin(module: str) -> None:
    """Record that the user named ``module`` (a module name, or a ``.py`` file's resolved path) as a plug-in."""
    _plugin_modules.add(module)


def plugin_named(plugin: str, base: Path | None = None) -> bool:
    """Whether the user named this plug-in themselves: a module by its name, a ``.py`` file (relative
    to ``base``) by the file it is."""
    if plugin.endswith(".py"):
        path = Path(plugin) if Path(plugin).is_absolute() or base is None else base / plugin
        return str(path.resolve()) in _plugin_modules
    return plugin in _plugin_modules


def trusted() -> bool:
    """Whether code named in files may be imported and called (``--trust-code``)."""
    return _trust[0]


def set_trust_code(value: bool) -> None:
    """Trust (or stop trusting) code named in files from now on (the CLI's ``--trust-code``)."""
    _trust[0] = bool(value)


@contextlib.contextmanager
def trusting(value: bool = True) -> Iterator[None]:
    """Within the block, code named in checkpoints and reports may be imported and called."""
    before, _trust[0] = _trust[0], bool(value)
    try:
        yield
    finally:
        _trust[0] = before


def _entry_point_names(group: str) -> set[str]:
    return {ep.value.replace(" ", "") for ep in entry_points(group=group)}


def _import(name: str, field: str) -> Any:
    module_name, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise UserError(f"{field} = {name!r}: cannot import it ({err})") from None
    return obj


def _allowed(name: str, registered: dict[str, Any], group: str) -> Any:
    """The registered object, ``True`` when importing ``name`` is allowed, else ``None``."""
    if name in registered:
        return registered[name]
    module = name.partition(":")[0]
    if name in _named or module in _plugin_modules or trusted() or name in _entry_point_names(group):
        return True
    return None


def _check_name(name: Any, field: str) -> str:
    if not isinstance(name, str) or not QUALNAME.match(name):
        raise UserError(f"expected 'package.module:attribute', got {name!r}", location=(field,))
    return name


def resolve_factory(name: str, field: str) -> Callable[..., Any]:
    """The factory ``name`` if the user registered, named or trusted it; a ``UserError`` otherwise."""
    name = _check_name(name, field)
    found = _allowed(name, _factories, FACTORY_GROUP)
    if found is None:
        raise UserError(
            f"{field} = {name!r} is not a registered model factory, so it is not imported; register it "
            f"(mase_lite.infra.trust.register_factory or the entry-point group {FACTORY_GROUP}), name its module "
            f"with --plugin, or {TRUST_HINT}"
        )
    fn = _import(name, field) if found is True else found
    if not callable(fn):
        raise UserError(f"{field} = {name!r} is not callable")
    return fn


def resolve_leaf_module(name: str, field: str, known: dict[str, type]) -> type | None:
    """The leaf-module class ``name``: one of ``known`` (the rebuilt model's own classes), else one the
    user registered or trusts; ``None`` when the model does not contain it and nothing vouches for it
    (such a class cannot change the capture, so it is simply not used)."""
    name = _check_name(name, field)
    if name in known:
        return known[name]
    found = _allowed(name, _leaf_modules, LEAF_GROUP)
    if found is None:
        return None
    cls = _import(name, field) if found is True else found
    import torch.nn as nn

    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UserError(f"{field} = {name!r} is not an nn.Module class")
    return cls


def admit_spec(spec: Any) -> None:
    """Record that the user's own spec names its model factory (so it, and checkpoints naming it, load)."""
    model = spec.get("model") if isinstance(spec, dict) else None
    factory = model.get("factory") if isinstance(model, dict) else None
    if isinstance(factory, str):
        name_factory(factory)


def admit_recorded(spec: Any, source: str, base: Path | None = None) -> Any:
    """A pipeline spec recorded in a report (data, maybe someone else's), admitted: each plug-in must be
    one the user named (``--plugin``; a ``.py`` file by its path, relative to ``base``) and the factory
    registered, named or trusted, else a ``UserError``. Returned as a copy with every trust decision
    it records dropped (a step's ``trust_code`` is false unless the user passes ``--trust-code``) and
    the download caches it names dropped (the run keeps them inside its own directory).
    """
    if not isinstance(spec, dict):
        return spec
    spec = copy.deepcopy(spec)
    plugins = spec.get("plugins")
    for i, plugin in enumerate(plugins if isinstance(plugins, list) else []):
        if not trusted() and not (isinstance(plugin, str) and plugin_named(plugin, base)):
            raise UserError(
                f"{source}: plugins.{i} = {short(plugin)} is recorded in the report, so it is not imported; "
                f"name it with --plugin, or {TRUST_HINT}"
            )
    model = spec.get("model")
    factory = model.get("factory") if isinstance(model, dict) else None
    if factory is not None:
        resolve_factory(factory, f"{source}: model.factory")
    for section in ("model", "data"):  # download caches: written where the recording said, so dropped
        if isinstance(spec.get(section), dict) and spec[section].pop("cache_dir", None) is not None:
            logger.warning("%s: %s.cache_dir is recorded in the report and ignored; downloads go into the run", source, section)
    steps = spec.get("steps")
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        params = step.get("params") if isinstance(step, dict) else None
        if isinstance(params, dict) and params.get("trust_code") is True and not trusted():
            logger.warning("%s: steps.%d.params.trust_code is recorded in the report and ignored; pass --trust-code "
                           "to trust the checkpoint's code", source, i)
            params["trust_code"] = False
    return spec


def call_factory(factory: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> Any:
    """``factory(**kwargs)``, which must give an ``nn.Module``; errors name ``model.factory`` and its kwargs.

    The model is first built on the meta device to check its size against the memory available
    (:func:`mase_lite.infra.limits.model_bytes`); a factory that cannot build there is called as it is."""
    import torch.nn as nn

    from mase_lite.infra.limits import check_fits, model_bytes

    try:
        estimate = model_bytes(lambda k: factory(**k), kwargs, "model.kwargs")
    except UserError:
        estimate = 0  # it cannot build there (bad kwargs, or it computes on its weights): the real call says why
    check_fits("model.kwargs", estimate, f"the model {name!r} makes from these kwargs")
    try:
        model = factory(**kwargs)
    except TypeError as err:
        raise UserError(f"model.factory = {name!r}: bad model.kwargs {sorted(kwargs)}: {err}") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"model.factory = {name!r} returned {type(model).__name__}, not an nn.Module")
    return model
