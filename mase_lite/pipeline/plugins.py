"""Plug-ins named by a spec's ``plugins`` or the CLI's ``--plugin``: modules or files imported so they register passes.

>>> import_plugins(["json"])          # any importable module
>>> import_plugins(["no_such_module_here"])
Traceback (most recent call last):
...
mase_lite.infra.errors.UserError: plugins.0: cannot import module 'no_such_module_here': No module named 'no_such_module_here'
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from mase_lite.infra.errors import UserError
from mase_lite.infra.trust import name_plugin


def import_plugins(plugins: list[str], base: Path | None = None) -> None:
    """Import each plug-in: a module name (``my_pkg.passes``) or a ``.py`` file (relative to ``base``), importable
    afterwards by its own name (``nets.py`` as ``nets``) where no other module has that name."""
    for i, plugin in enumerate(plugins):
        if not isinstance(plugin, str) or not plugin:
            raise UserError(f"expected a module name or a .py file, got {plugin!r}", location=("plugins", i))
        if plugin.endswith(".py"):
            path = Path(plugin) if Path(plugin).is_absolute() or base is None else base / plugin
            if not path.is_file():
                raise UserError(f"no such file: {path}", location=("plugins", i))
            name = f"mase_lite_plugin_{path.stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
            name_plugin(str(path.resolve()))
            name_plugin(name)
            if name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            alias = _own_name(path)
            if alias is not None:  # ``"factory": "nets:make"`` names the file's module by its own name
                sys.modules[alias] = module
                name_plugin(alias)
            try:
                spec.loader.exec_module(module)
            except Exception as err:
                del sys.modules[name]
                if alias is not None:
                    del sys.modules[alias]
                raise UserError(f"importing {path} failed: {type(err).__name__}: {err}", location=("plugins", i)) from None
        else:
            try:
                importlib.import_module(plugin)
            except ImportError as err:
                raise UserError(f"cannot import module {plugin!r}: {err}", location=("plugins", i)) from None
            name_plugin(plugin)


def _own_name(path: Path) -> str | None:
    """The file's stem as a module name, where no other module has it (a plug-in never shadows one)."""
    stem = path.stem
    if not stem.isidentifier() or stem in sys.modules:
        return None
    try:
        if importlib.util.find_spec(stem) is not None:
            return None
    except (ImportError, ValueError):
        return None
    return stem
