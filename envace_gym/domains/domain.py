"""Domains: tools + tasks + reward + (optionally) a real executor.

A :class:`Domain` is mostly data. Its :class:`Task` objects carry the user turn(s), the tool whitelist,
the reference trajectory (calls *and* the real results they produced; the rehearse role's privileged
few-shot), and what the reward checks. The built-in domains live in ``envs/`` (installed as
``envace_gym.envs``); users register their own with :func:`register_domain`, pass a Domain object to
the environment, or point :func:`make_domain` at a folder (see :class:`FolderDomain`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DomainError, TaskNotFoundError
from ..tools.canonical import canonical_json
from ..tools.executor import ToolExecutor
from ..tools.schema import ToolRegistry
from .reward import RewardResult, score_expected
from .task import SPLITS, LazyTasks, Task, check_split, stable_hash
from .trajectory import Trajectory
from .user_protocol import ENVACE_PROTOCOL, UserProtocol

if TYPE_CHECKING:
    from .spec import DomainSpec


class Domain:
    """Base class: a set of tools, a source of tasks, a reward, and optionally a real executor.

    Subclasses set ``name``, ``description``, ``system_prompt``, provide :attr:`tools` and :meth:`tasks`,
    and, for ``executor="real"``, :meth:`make_executor`. The default :meth:`score` is
    :func:`score_expected`.
    """

    name: str = ""  # what its task ids start with ("units/train/000"): the id without its version
    description: str = ""
    system_prompt: str = "You are a helpful assistant. Use the tools when they help, then answer the user."
    max_turns: int = 12
    # How a simulated user plays this domain's tasks: its prompt, sampling, the episode's bounds and scoring (a
    # benchmark's own protocol subclasses UserProtocol in its envs/ folder, as envs/tau2/protocol.py does)
    user_protocol: UserProtocol = ENVACE_PROTOCOL
    executes_calls: bool = True  # False when the real executor only acknowledges calls (nothing to rehearse toward)
    # Tasks whose reference is known to be wrong upstream (a benchmark's data), with why: the domain check reports
    # their findings as warnings, not errors.
    known_issues: Mapping[str, str] = {}
    # The registered spec it was made from (make_domain sets it, as gym.make sets env.spec); None when built directly
    spec: DomainSpec | None = None

    @property
    def id(self) -> str:
        """The versioned id figures name (``units-v0``, ``lights:easy-v0``); the bare name when made from no spec."""
        return self.spec.id if self.spec is not None else self.name

    @property
    def tools(self) -> ToolRegistry:
        raise NotImplementedError

    def tasks(self, split: str = "train") -> Sequence[Task]:
        raise NotImplementedError

    def make_executor(self, task: Task) -> ToolExecutor | None:
        """A fresh real executor over ``task.initial_state``; ``None`` when the domain has none."""
        return None

    def score(self, task: Task, trajectory: Trajectory) -> RewardResult:
        return score_expected(task, trajectory, self.make_executor(task))

    # -- lookups shared by every domain -----------------------------------------------------------------
    def task(self, task_id: str, split: str = "train") -> Task:
        """A task by id. ``"<domain>/<index>"`` is short for ``"<domain>/<split>/<index>"``."""
        found = self._find(task_id)
        parts = task_id.split("/")
        if found is None and len(parts) == 2 and parts[1].isdigit():
            found = self._find(f"{parts[0]}/{split}/{int(parts[1]):03d}")
        if found is None:
            raise TaskNotFoundError(f"domain {self.name!r} has no task {task_id!r}")
        return found

    def _find(self, task_id: str) -> Task | None:
        parts = task_id.split("/")
        if len(parts) == 3 and parts[0] == self.name and parts[1] in SPLITS and parts[2].isdigit():
            tasks, index = self.tasks(parts[1]), int(parts[2])  # generated ids say where they are
            if 0 <= index < len(tasks) and tasks[index].id == task_id:
                return tasks[index]
        return next((t for s in SPLITS for t in self.tasks(s) if t.id == task_id), None)

    def sample_task(self, rng: np.random.Generator, split: str = "train") -> Task:
        tasks = self.tasks(split)
        if not len(tasks):
            raise DomainError(f"domain {self.name!r} has no {split!r} tasks")
        return tasks[int(rng.integers(len(tasks)))]

    def tool_names(self) -> list[str]:
        """Every tool name the domain's tasks may offer."""
        return self.tools.names

    def tools_for(self, task: Task) -> ToolRegistry:
        """The registry ``task``'s calls are validated against (the domain's, unless tasks bring their own)."""
        return self.tools

    def whitelist(self, task: Task) -> tuple[str, ...]:
        return task.tools or tuple(self.tools_for(task).names)

    def user_tools_for(self, task: Task) -> ToolRegistry | None:
        """The tools of ``task``'s user, where the user acts on the world too (τ²-Bench's telecom user holds the
        phone): a simulated user is offered them, and the domain's executor answers them
        (:meth:`ToolExecutor.execute_user`). ``None`` (most domains): the user only talks."""
        return None

    def locate(self, task: Task | None = None) -> str:
        """Where the domain (or ``task``) is written, for the domain check's findings: the class and its file."""
        cls = type(self)
        try:
            origin = f"{inspect.getsourcefile(cls)} ({cls.__name__})"
        except TypeError:  # a class without a source file
            origin = cls.__name__
        return origin if task is None else f"{origin}: task {task.id!r}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


STALE_DRAWS = 20_000  # draws without a new task after which a generator is taken to have no more


class _Draws:
    """The distinct task parameters of one split of a :class:`GeneratedDomain`, drawn in index order (candidate
    ``k`` from ``default_rng([seed, k])``, kept if new and of this split), and the task built from each."""

    def __init__(self, domain: GeneratedDomain, split: str, size: int) -> None:
        self._domain, self._split, self._size = domain, split, size
        self._params: list[Any] = []
        self._candidate = 0
        self._seen: set[str] = set()

    def _params_for(self, index: int) -> Any:
        d = self._domain
        stale = 0  # candidates since the last new task of this split
        while len(self._params) <= index:
            rng = np.random.default_rng([d.seed, self._candidate])
            self._candidate += 1
            if stale >= STALE_DRAWS:
                raise DomainError(
                    f"{d.name}: cannot generate {self._size} distinct {self._split} tasks: {len(self._params)} found, "
                    f"then {STALE_DRAWS} draws of sample_params gave no new one; lower num_tasks "
                    f"(num_tasks={{'{self._split}': {len(self._params)}}}) or draw more varied tasks"
                )
            params = d.sample_params(rng)
            key = d.task_key(params)
            if key in self._seen or d.split_of(key) != self._split:
                stale += 1
                continue
            self._seen.add(key)
            self._params.append(params)
            stale = 0
        return self._params[index]

    def task(self, index: int) -> Task:
        d = self._domain
        return d.build_task(self._params_for(index), f"{d.name}/{self._split}/{index:03d}", self._split)


class GeneratedDomain(Domain):
    """A domain whose tasks come from a seeded generator.

    Subclasses implement :meth:`sample_params` (draw a task's parameters from ``rng``), :meth:`task_key`
    (what makes two tasks "the same") and :meth:`build_task` (run the reference solution on the real
    executor). The split of a task is a hash of its key, so train and test never share a task, and
    task ``i`` of a split is the same on every machine.
    """

    executor_class: type[ToolExecutor] = ToolExecutor
    seed: int = 0
    num_tasks: Mapping[str, int] = {"train": 1000, "test": 200}
    test_fraction: float = 0.2

    def __init__(self, num_tasks: Mapping[str, int] | None = None, seed: int | None = None) -> None:
        if num_tasks is not None:
            self.num_tasks = {**self.num_tasks, **num_tasks}
        if seed is not None:
            self.seed = seed
        self._tools = ToolRegistry(self.executor_class.tool_schemas())
        sizes = {s: int(self.num_tasks.get(s, 0)) for s in SPLITS}
        self._tasks = {s: LazyTasks(sizes[s], _Draws(self, s, sizes[s]).task) for s in SPLITS}

    @property
    def tools(self) -> ToolRegistry:
        return self._tools

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self._tasks[check_split(split)]

    def split_of(self, key: str) -> str:
        return "test" if stable_hash(f"{self.name}:{key}") % 1000 < self.test_fraction * 1000 else "train"

    def make_executor(self, task: Task) -> ToolExecutor:
        return self.executor_class(task.initial_state)

    def sample_params(self, rng: np.random.Generator) -> Any:
        raise NotImplementedError

    def task_key(self, params: Any) -> str:
        return canonical_json(params)

    def build_task(self, params: Any, task_id: str, split: str) -> Task:
        raise NotImplementedError
