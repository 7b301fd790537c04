"""Names a package exports without importing them until first use (PEP 562), so that importing the package
does not import torch: ``envace_gym``, ``envace_gym.policy`` and ``envace_gym.env`` use it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``names[name]`` (a module, relative to ``package``) on first use."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
