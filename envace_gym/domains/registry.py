"""Domain names: register one, list them, and resolve whatever a user passes as ``domain=``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import DomainError
from .domain import Domain
from .folder import FolderDomain, import_file

# ----------------------------------------------------------------------------------------------------
# Registry of domain names
# ----------------------------------------------------------------------------------------------------
_FACTORIES: dict[str, Callable[..., Domain] | str] = {}
_FROM_ENTRY_POINTS: set[str] = set()  # names that came from entry points: register_domain may replace them


def register_domain(name: str, factory: Callable[..., Domain] | str, *, overwrite: bool = False) -> None:
    """Make ``domain=name`` work everywhere: ``factory`` is a Domain class, a callable, or ``"module:attr"``.
    A name only declared by an installed package's entry point is replaced without ``overwrite``."""
    if name in _FACTORIES and not overwrite and name not in _FROM_ENTRY_POINTS:
        raise DomainError(f"a domain named {name!r} is already registered (pass overwrite=True to replace it)")
    _FACTORIES[name] = factory
    _FROM_ENTRY_POINTS.discard(name)


ENTRY_POINT_GROUP = "envace_gym.domains"


def _installed_domains() -> None:
    """Add the domains other installed packages declare as entry points (group ``envace_gym.domains``,
    ``name = "module:attr"``); names registered in this process win."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in _FACTORIES:
            _FACTORIES[entry.name] = entry.value
            _FROM_ENTRY_POINTS.add(entry.name)


def list_domains() -> list[str]:
    _installed_domains()
    return sorted(_FACTORIES)


def _load_reference(ref: str) -> Any:
    """What ``"module:attr"`` or ``"path/to/file.py:attr"`` names, in the user's own code (imported as any
    module is; model text is never executed)."""
    where, _, attr = ref.rpartition(":")
    if where.endswith(".py"):
        file = Path(where)
        if not file.is_file():
            raise DomainError(f"domain {ref!r}: no file {where}")
        module = import_file(file, f"envace_user_domain_{file.stem}")
    else:
        if not where:
            raise DomainError(f"domain {ref!r}: no module before the ':'")
        if importlib.util.find_spec(where.split(".")[0]) is None and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))  # `envace` is a console script: its sys.path lacks the cwd
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise DomainError(
                f"domain {ref!r}: not a registered name or family ({list_domains()}), and no module {where!r} "
                f"can be imported ({exc})"
            ) from exc
    if not hasattr(module, attr):
        raise DomainError(f"domain {ref!r}: {where} has no attribute {attr!r}")
    return getattr(module, attr)


def make_domain(domain: str | Path | Domain, **kwargs: Any) -> Domain:
    """Resolve ``domain=``: a Domain object, a registered name (entry points of other packages included), a
    path to a domain folder, a conversation dataset (a ``.jsonl``/``.json``/``.parquet`` file, a ``datasets``
    folder or object: :class:`~envace_gym.domains.dataset.DatasetDomain`, ``kwargs`` such as ``format=``), or a
    reference into the user's code, ``"module:attr"`` / ``"file.py:attr"``."""
    if isinstance(domain, Domain):
        return domain
    from .dataset import DatasetDomain, is_dataset_source

    if (not isinstance(domain, str) or domain not in _FACTORIES) and is_dataset_source(domain):
        return DatasetDomain(domain, **kwargs)  # conversations: .jsonl/.json/.parquet, a datasets folder or object
    if isinstance(domain, Path) or (isinstance(domain, str) and domain not in _FACTORIES and Path(domain).is_dir()):
        return FolderDomain(domain)
    if not isinstance(domain, str):
        raise DomainError(f"domain must be a name, a folder or a Domain, got {type(domain).__name__}")
    if domain not in _FACTORIES:
        _installed_domains()
    factory, argument = _FACTORIES.get(domain), None
    if factory is None and ":" in domain:  # "bfcl:parallel", "tau2:retail": a family and one of its members
        family, _, argument = domain.partition(":")
        factory = _FACTORIES.get(family)
        if factory is None:  # "my_package.domains:LibraryDomain" or "my_domain.py:LibraryDomain"
            factory, argument = _load_reference(domain), None
    if factory is None:
        raise DomainError(f"unknown domain {domain!r}; registered: {list_domains()} (or pass a folder path)")
    if isinstance(factory, str):  # registered, or declared by an entry point, as "module:attr"
        factory = _load_reference(factory)
    if isinstance(factory, Domain):  # a reference (or registration) naming an instance
        return factory
    if not callable(factory):
        raise DomainError(f"domain {domain!r} is {type(factory).__name__}, not a Domain, a Domain class or a factory")
    built = factory(argument, **kwargs) if argument is not None else factory(**kwargs)
    if not isinstance(built, Domain):
        raise DomainError(f"the factory of domain {domain!r} returned {type(built).__name__}, not a Domain")
    return built
