"""Package namespaces whose names are imported on first use (``lazy_names``).

A package ``__init__`` that imported its modules eagerly would import torch,
Lightning and torchrl with it; the console scripts import a light module of
such a package first (the Ctrl-C guard) and must answer at once.
"""

from __future__ import annotations

import importlib
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
