"""Package namespaces whose names are imported on first use (``lazy_names``).

A package ``__init__`` that imported its modules eagerly would import torch,
Lightning and torchrl with it; the console scripts import a light module of
such a package first (the Ctrl-C guard) and must answer at once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name in ``homes`` imported from its module.

    Examples:
        >>> namespace = {}
        >>> getattr_, dir_ = lazy_names("demo", {"sqrt": "math"}, namespace)
        >>> getattr_("sqrt")(4.0), "sqrt" in namespace
        (2.0, True)
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *homes])

    return __getattr__, __dir__


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old module paths that still import, as the module now at the new path (for one release).

    ``import rb_lightning.stream.handles`` after the module moved to
    ``rb_lightning.buffers.handles`` gives the new module itself (one object, so
    ``isinstance`` and module state agree), and warns once with the new path.

    Examples:
        >>> import sys
        >>> finder = MovedModules({"old_json_name": "json"})
        >>> sys.meta_path.insert(0, finder)
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     import old_json_name
        >>> old_json_name is importlib.import_module("json")
        True
        >>> sys.meta_path.remove(finder); del sys.modules["old_json_name"]
    """

    def __init__(self, moves: Mapping[str, str]) -> None:
        self.moves = dict(moves)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.moves:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> Any:
        new = self.moves[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path works until the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: Any) -> None:
        """The module is the new one, already executed."""
