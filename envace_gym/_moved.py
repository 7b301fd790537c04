"""The module paths of 0.1 that 0.2 moved, kept working with a DeprecationWarning: ``import envace_gym.formats``
gives ``envace_gym.parsing.formats`` itself (the same module object, so ``monkeypatch`` and ``isinstance`` see
one module). The old paths whose name is now a subpackage (``tools``, ``parsing``, ``domains``, ``policy``,
``episode``, ``env``, ``rollout``, ``cli``) need no alias: the subpackage re-exports what the module held.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "envace_gym.advantages": "envace_gym.training.advantages",
    "envace_gym.batching": "envace_gym.episode.driver",
    "envace_gym.bench": "envace_gym.recipes.bench",
    "envace_gym.bench_train": "envace_gym.recipes.bench_train",
    "envace_gym.chat": "envace_gym.episode.chat",
    "envace_gym.checklists": "envace_gym.domains.checklists",
    "envace_gym.dataset_domain": "envace_gym.domains.dataset",
    "envace_gym.demo": "envace_gym.recipes.demo",
    "envace_gym.evaluate": "envace_gym.evaluation.evaluate",
    "envace_gym.executors": "envace_gym.tools.executor",
    "envace_gym.experiment": "envace_gym.recipes.experiment",
    "envace_gym.formats": "envace_gym.parsing.formats",
    "envace_gym.judge": "envace_gym.domains.judge",
    "envace_gym.memory": "envace_gym.training.memory",
    "envace_gym.model_card": "envace_gym.training.model_card",
    "envace_gym.models": "envace_gym.policy.default_model",
    "envace_gym.packing": "envace_gym.training.packing",
    "envace_gym.planning": "envace_gym.rollout.planner",
    "envace_gym.precision": "envace_gym.policy.precision",
    "envace_gym.registration": "envace_gym.env.registration",
    "envace_gym.sessions": "envace_gym.policy.sessions",
    "envace_gym.sft": "envace_gym.training.sft",
    "envace_gym.simulator": "envace_gym.rehearsal",
    "envace_gym.spaces": "envace_gym.env.spaces",
    "envace_gym.train": "envace_gym.recipes.train",
    "envace_gym.trainer": "envace_gym.training.trainer",
    "envace_gym.vector": "envace_gym.env.vector",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module it moved to."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new} in envace-gym 0.2; the old path goes in 0.3", DeprecationWarning, stacklevel=2
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module it moved to is already executed."""


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())


