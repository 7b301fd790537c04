"""Domain ids and their specs: what an id such as ``units-v0`` stands for, as Gymnasium's ``EnvSpec`` does for
``CartPole-v1``.

An id is ``<name>-v<version>``. A family's member (``lights:easy``, ``bfcl:parallel``) is named before the
version, which is the family's: ``lights:easy-v0``. A new version is registered whenever what a domain's episodes
are changes (its task generator, its data, its limits), so a figure measured on ``units-v0`` stays reproducible
after ``units`` moves on; the bare name (``units``) means the latest version.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .domain import Domain

_VERSION = re.compile(r"^(?P<name>.+)-v(?P<version>\d+)$")


def split_version(domain_id: str) -> tuple[str, int | None]:
    """``"lights:easy-v0"`` → ``("lights:easy", 0)``; an id without a version → ``(id, None)``."""
    found = _VERSION.match(domain_id)
    return (found["name"], int(found["version"])) if found else (domain_id, None)


def versioned(name: str, version: int | None) -> str:
    """The id of ``name`` at ``version`` (``name`` itself for an unversioned registration)."""
    return name if version is None else f"{name}-v{version}"


@dataclass(frozen=True)
class DomainSpec:
    """A registered domain id: how to build the domain and the limits of its episodes.

    ``entry_point`` is a Domain class, a factory, a Domain object or ``"module:attr"`` (imported only when the id
    is made). ``max_turns``, when set, is the domain's limit of Act turns per episode (what
    ``EpisodeConfig.max_turns=None`` means); ``None`` keeps the domain object's own. ``kwargs`` go to the entry
    point, under the caller's.
    """

    id: str
    entry_point: Callable[..., Domain] | Domain | str
    max_turns: int | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id or self.id != self.id.strip():
            raise ValueError(f"a domain id must be a non-empty name without surrounding spaces, got {self.id!r}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"{self.id}: max_turns must be at least 1, got {self.max_turns}")

    @property
    def name(self) -> str:
        """The id without its version: ``units`` for ``units-v0``."""
        return split_version(self.id)[0]

    @property
    def version(self) -> int | None:
        return split_version(self.id)[1]
