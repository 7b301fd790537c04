"""Domain names: register one, list them, and resolve whatever a user passes as ``domain=``."""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import DomainError
from .check import verify_domain
from .domain import Domain
from .folder import FolderDomain, import_file

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


def _did_you_mean(name: str) -> str:
    """``" did you mean 'bank'?"`` when a registered name is close to ``name`` (a typo), else ``""``.
    For ``"family:member"`` the family is matched and the member kept (``"bfc:parallel"`` → ``"bfcl:parallel"``)."""
    family, colon, member = name.partition(":")
    close = difflib.get_close_matches(family if colon else name, list_domains(), n=1)
    return f" did you mean {close[0] + colon + member!r}?" if close else ""


def describe_domain(name: str) -> str:
    """One line about the registered domain ``name``, found without building it: its factory's ``description``
    (a class attribute) or else the first sentence of its docstring. A ``"module:attr"`` factory (the built-in
    domains, entry points) is not even imported: the module's source is read, so listing stays fast when a module
    loads benchmark data or heavy packages (only its parent packages are imported, to locate it)."""
    _installed_domains()
    if name not in _FACTORIES:
        raise DomainError(f"unknown domain {name!r};{_did_you_mean(name)} registered: {list_domains()}")
    factory = _FACTORIES[name]
    if isinstance(factory, str):
        description, doc = _described_in_source(factory)
    else:  # a Domain class or instance, or a factory function: already imported
        description = getattr(factory, "description", "")
        doc = factory.__doc__  # a class's own docstring (not inherited from Domain)
    if isinstance(description, str) and description.strip():
        return description.strip()
    return _first_sentence(doc) if isinstance(doc, str) else ""


def _described_in_source(ref: str) -> tuple[str, str]:
    """``(description, docstring)`` of the class or function ``"module:attr"`` names, read from the module's
    source; empty strings when the source cannot be found or ``attr`` is not defined there by a class/def."""
    where, _, attr = ref.rpartition(":")
    if where.endswith(".py"):
        path: Path | None = Path(where)
    else:
        try:
            spec = importlib.util.find_spec(where) if where else None
        except (ImportError, ValueError):  # a parent package that does not import
            spec = None
        path = Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None
    if path is None or not path.is_file():
        return "", ""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return "", ""
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == attr:
            description = _class_description(node) if isinstance(node, ast.ClassDef) else ""
            return description, ast.get_docstring(node) or ""
    return "", ""


def _class_description(node: ast.ClassDef) -> str:
    """The string a class body assigns to ``description`` (``description = "..."``), if it is a literal."""
    for item in node.body:
        targets = (
            item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
        )
        named = any(isinstance(target, ast.Name) and target.id == "description" for target in targets)
        value = getattr(item, "value", None)
        if named and isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value
    return ""


def _first_sentence(doc: str, width: int = 100) -> str:
    """The first sentence of a docstring's first prose paragraph (Markdown headings such as the Gymnasium-style
    ``## Description`` skipped), on one line of at most ``width`` characters."""
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        text = " ".join(line.strip() for line in paragraph.splitlines() if not line.lstrip().startswith("#"))
        text = text.replace("``", "").strip()
        if text:
            sentence = text.split(". ")[0].rstrip(".")
            return textwrap.shorten(sentence, width=width, placeholder=" …")
    return ""


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
                f"domain {ref!r}: not a registered name or family;{_did_you_mean(ref)} registered: "
                f"{list_domains()}, and no module {where!r} can be imported ({exc})"
            ) from exc
    if not hasattr(module, attr):
        raise DomainError(f"domain {ref!r}: {where} has no attribute {attr!r}")
    return getattr(module, attr)


def _name_the_class(file: str) -> str:
    """The error for ``"path/file.py"`` without ``":Class"``: the form to use, with the classes the file defines
    (read from its source, not run)."""
    path = Path(file)
    if not path.is_file():
        return f"domain {file!r}: no such file (a Python domain is named 'path/to/file.py:ClassName')"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        classes = []
    domains = [name for name in classes if name.endswith("Domain")] or classes
    example = f"{file}:{domains[0] if domains else 'ClassName'}"
    return (f"domain {file!r} is a Python file: name the Domain class (or factory) in it, as {example!r}"
            + (f" (it defines {domains})" if domains else ""))  # fmt: skip


def make_domain(domain: str | Path | Domain, **kwargs: Any) -> Domain:
    """Resolve ``domain=``: a Domain object, a registered name (entry points of other packages included), a
    path to a domain folder, a conversation dataset (a ``.jsonl``/``.json``/``.parquet`` file, a ``datasets``
    folder or object: :class:`~envace_gym.domains.dataset.DatasetDomain`, ``kwargs`` such as ``format=``), or a
    reference into the user's code, ``"module:attr"`` / ``"file.py:attr"``. The domain passes the load-time domain
    check first (:func:`~envace_gym.domains.check.verify_domain`): its first error is a :class:`DomainError`."""
    return verify_domain(resolve_domain(domain, **kwargs))  # every loader's domain, checked once (domains/check.py)


def resolve_domain(domain: str | Path | Domain, **kwargs: Any) -> Domain:
    """:func:`make_domain` without the load-time check (``envace domains --check`` reports every finding)."""
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
    if factory is None and domain.endswith(".py"):
        raise DomainError(_name_the_class(domain))
    if factory is None:
        raise DomainError(
            f"unknown domain {domain!r};{_did_you_mean(domain)} registered: {list_domains()} (or pass a folder path)"
        )
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
