"""Domain ids: register one (with its spec), list them, and resolve whatever a user passes as ``domain=``."""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import DomainError
from .check import verify_domain
from .domain import Domain
from .folder import FolderDomain, import_file
from .spec import DomainSpec, split_version, versioned

_SPECS: dict[str, DomainSpec] = {}
_FROM_ENTRY_POINTS: set[str] = set()  # ids that came from entry points: register_domain may replace them


def register_domain(
    domain_id: str,
    entry_point: Callable[..., Domain] | Domain | str,
    *,
    max_turns: int | None = None,
    kwargs: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> None:
    """Make ``domain=domain_id`` work everywhere, as Gymnasium's ``register`` does for an env id: ``entry_point`` is
    a Domain class, a factory, a Domain object or ``"module:attr"``; ``max_turns`` the domain's limit of Act turns
    per episode; ``kwargs`` go to the entry point. Version the id (``"mine-v0"``) so that ``"mine"`` means its
    latest version and a changed task generator gets a new id (``envace_gym.domains.spec``). An id only declared by
    an installed package's entry point is replaced without ``overwrite``."""
    spec = DomainSpec(domain_id, entry_point, max_turns=max_turns, kwargs=dict(kwargs or {}))
    if not overwrite and domain_id not in _FROM_ENTRY_POINTS:
        # one id once; and a name either versioned or not, so that the bare name means one thing
        clash = [s.id for s in _SPECS.values() if s.id == domain_id or (s.name == spec.name and None in (s.version, spec.version))]  # fmt: skip
        if clash:
            raise DomainError(
                f"a domain {domain_id!r} is already registered, as {clash} (register a new version, or pass "
                "overwrite=True to replace it)"
            )
    _SPECS[domain_id] = spec
    _FROM_ENTRY_POINTS.discard(domain_id)


ENTRY_POINT_GROUP = "envace_gym.domains"


def _installed_domains() -> None:
    """Add the domains other installed packages declare as entry points (group ``envace_gym.domains``,
    ``id = "module:attr"``); ids registered in this process win."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in _SPECS:
            _SPECS[entry.name] = DomainSpec(entry.name, entry.value)
            _FROM_ENTRY_POINTS.add(entry.name)


def list_domains() -> list[str]:
    """Every registered id (``units-v0``, …; a family such as ``bfcl-v0`` is made with a member:
    ``bfcl:parallel-v0``)."""
    _installed_domains()
    return sorted(_SPECS)


def _named(name: str, version: int | None) -> DomainSpec | None:
    """The spec of ``name`` at ``version``; without one, an unversioned registration of ``name``, else its latest
    version."""
    if version is not None:
        return _SPECS.get(versioned(name, version))
    if name in _SPECS:
        return _SPECS[name]
    versions = [spec for spec in _SPECS.values() if spec.name == name and spec.version is not None]
    return max(versions, key=lambda spec: spec.version or 0) if versions else None


def find_spec(domain_id: str) -> tuple[DomainSpec, str | None] | None:
    """The spec ``domain_id`` names and the family member it asks for (``"lights:easy-v0"`` → the spec of
    ``lights-v0`` and ``"easy"``), or ``None`` when it names no registered domain."""
    for attempt in range(2):
        name, version = split_version(domain_id)
        spec = _named(name, version)
        if spec is not None:
            return spec, None
        family, colon, member = name.partition(":")
        spec = _named(family, version) if colon else None
        if spec is not None:
            return spec, member
        if attempt == 0:
            _installed_domains()  # (read only when the name is not registered in this process)
    return None


def registered_id(domain_id: str) -> str | None:
    """The registered id ``domain_id`` names (``"units"`` → ``"units-v0"``, ``"lights:easy"`` →
    ``"lights:easy-v0"``), or ``None`` when it names no registered domain (a folder, a file, a reference)."""
    found = find_spec(domain_id)
    if found is None:
        return None
    spec, member = found
    return versioned(f"{spec.name}:{member}", spec.version) if member else spec.id


def _did_you_mean(domain_id: str) -> str:
    """``" did you mean 'bank'?"`` when a registered name is close to ``domain_id`` (a typo), else ``""``.
    For ``"family:member"`` the family is matched and the member kept (``"bfc:parallel"`` → ``"bfcl:parallel"``);
    a version asked for is kept too."""
    name, version = split_version(domain_id)
    family, colon, member = name.partition(":")
    names = sorted({spec.name for spec in _SPECS.values()})
    close = difflib.get_close_matches(family if colon else name, names, n=1)
    return f" did you mean {versioned(close[0] + colon + member, version)!r}?" if close else ""


def _unknown(domain_id: str, hint: str = " (or pass a folder path)") -> str:
    """Why ``domain_id`` is not made: a version that was never registered (with the ones that were), else a
    name nobody registered (with a close one)."""
    name, version = split_version(domain_id)
    family = name.partition(":")[0]
    known = sorted(spec.id for spec in _SPECS.values() if spec.name in (name, family))
    if version is not None and known:
        return f"domain {domain_id!r}: no such version; registered: {known}"
    return f"unknown domain {domain_id!r};{_did_you_mean(domain_id)} registered: {list_domains()}{hint}"


def describe_domain(name: str) -> str:
    """One line about the registered domain ``name`` (an id, or a bare name: its latest version), found without building it: its factory's ``description``
    (a class attribute) or else the first sentence of its docstring. A ``"module:attr"`` factory (the built-in
    domains, entry points) is not even imported: the module's source is read, so listing stays fast when a module
    loads benchmark data or heavy packages (only its parent packages are imported, to locate it)."""
    found = find_spec(name)
    if found is None:
        raise DomainError(_unknown(name, hint=""))
    factory = found[0].entry_point
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

    found = find_spec(domain) if isinstance(domain, str) else None
    if found is None and is_dataset_source(domain):
        return DatasetDomain(domain, **kwargs)  # conversations: .jsonl/.json/.parquet, a datasets folder or object
    if found is None and (isinstance(domain, Path) or (isinstance(domain, str) and Path(domain).is_dir())):
        return FolderDomain(domain)
    if not isinstance(domain, str):
        raise DomainError(f"domain must be a name, a folder or a Domain, got {type(domain).__name__}")
    if found is None and ":" in domain and not domain.endswith(".py"):
        # "my_package.domains:LibraryDomain" or "my_domain.py:LibraryDomain": the user's own code, no spec
        return _build(domain, _load_reference(domain), None, kwargs)
    if found is None and domain.endswith(".py"):
        raise DomainError(_name_the_class(domain))
    if found is None:
        raise DomainError(_unknown(domain))
    spec, member = found
    factory = _load_reference(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    built = _build(domain, factory, member, {**spec.kwargs, **kwargs})
    # the domain says which id it was made from (a member's own: "lights:easy-v0") and keeps the spec's limits
    built.spec = replace(spec, id=versioned(f"{spec.name}:{member}", spec.version)) if member else spec
    if spec.max_turns is not None:
        built.max_turns = spec.max_turns
    return built


def _build(domain: str, factory: Any, member: str | None, kwargs: Mapping[str, Any]) -> Domain:
    """Call ``factory`` (with the family ``member`` first, where one is asked for); refuse what is not a Domain."""
    if isinstance(factory, Domain):  # a reference (or registration) naming an instance
        return factory
    if not callable(factory):
        raise DomainError(f"domain {domain!r} is {type(factory).__name__}, not a Domain, a Domain class or a factory")
    built = factory(member, **kwargs) if member is not None else factory(**kwargs)
    if not isinstance(built, Domain):
        raise DomainError(f"the factory of domain {domain!r} returned {type(built).__name__}, not a Domain")
    return built
