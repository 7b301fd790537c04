"""A domain from a folder: ``tools.json``, ``tasks.jsonl`` and, optionally, ``executor.py``."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import DomainError, EnvACEError
from ..tools.executor import ToolExecutor
from ..tools.schema import ToolRegistry
from .check import schema_findings
from .domain import Domain
from .task import SPLITS, Task, check_split
from .trajectory import Trajectory


class FolderDomain(Domain):
    """A domain described by files, for users who would rather write data than code.

    Folder layout::

        my_domain/
          domain.json     {"name": ..., "description": ..., "system_prompt": ..., "max_turns": ...}
          tools.json      a list of tools: OpenAI, MCP or BFCL form
          tasks.jsonl     one Task per line (see Task.to_dict); "split" says train or test
          executor.py     optional: a ToolExecutor subclass named Executor (enables executor="real")
          reward.py       optional: a function score(task, trajectory) (else the tasks' expected checks)

    ``executor.py`` and ``reward.py`` are the user's own code, imported like any module; model text is never
    executed.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_file = self.path / "domain.json"
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
            tool_specs = json.loads((self.path / "tools.json").read_text(encoding="utf-8"))
            lines = (self.path / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
        except (OSError, ValueError) as exc:
            raise DomainError(f"cannot read domain folder {self.path}: {exc}") from exc
        self.name = meta.get("name", self.path.name)
        self.description = meta.get("description", "")
        self.system_prompt = meta.get("system_prompt", Domain.system_prompt)
        self.max_turns = int(meta.get("max_turns", Domain.max_turns))
        self._tools = self._load_tools(tool_specs)
        self._executor_class = self._load_executor()
        self._check_executor_tools()
        self._score = self._load_reward()
        self._tasks: dict[str, list[Task]] = {s: [] for s in SPLITS}
        first_line: dict[str, int] = {}
        self._lines = first_line  # where each task is written, for the domain check's findings
        for n, line in enumerate(lines, 1):
            if line.strip():
                where = f"{self.path / 'tasks.jsonl'}:{n}"
                try:
                    task = Task.from_dict(json.loads(line), self.name)
                except ValueError as exc:
                    raise DomainError(f"{where}: {exc}") from exc
                if task.id in first_line:
                    raise DomainError(f"{where}: task id {task.id!r} is already used on line {first_line[task.id]}; "
                                      "give every task its own id")  # fmt: skip
                first_line[task.id] = n
                self._check_task(task, where)
                self._tasks[task.split].append(task)

    def _load_tools(self, specs: Any) -> ToolRegistry:
        """``tools.json`` as a registry, or a :class:`DomainError` naming the tool and the fix."""
        file = self.path / "tools.json"
        if isinstance(specs, Mapping) and isinstance(specs.get("tools"), list):
            raise DomainError(f"{file}: holds an object with a 'tools' key (an MCP tools/list result); "
                              "write the list itself: [{...}, ...]")  # fmt: skip
        if not isinstance(specs, list):
            raise DomainError(f"{file}: must be a JSON list of tools, got a {type(specs).__name__}")
        registry = ToolRegistry()
        for i, spec in enumerate(specs):
            fn = spec.get("function") if isinstance(spec, Mapping) else None
            name = (
                spec.get("name", fn.get("name") if isinstance(fn, Mapping) else None)
                if isinstance(spec, Mapping)
                else None
            )
            if isinstance(spec, Mapping) and "input_schema" in spec and "inputSchema" not in spec:
                raise DomainError(f"{file}: tool {i} ({name!r}) has 'input_schema'; MCP spells it 'inputSchema' "
                                  "(or use the OpenAI form with 'parameters')")  # fmt: skip
            try:
                tool = registry.add(spec)
            except EnvACEError as exc:
                raise DomainError(f"{file}: tool {i} ({name!r}): {exc}") from exc
            for finding in schema_findings(tool, str(file)):  # before the tasks: a schema's mistake is the cause
                if finding.level == "error":
                    raise DomainError(f"{finding.where}: {finding.message}")
        return registry

    def _check_executor_tools(self) -> None:
        if self._executor_class is None:
            return
        implemented = set(self._executor_class.tool_functions)  # names only: tools.json holds the schemas
        missing = [t.name for t in self._tools if t.name not in implemented]
        if missing:
            raise DomainError(
                f"{self.path / 'tools.json'}: {missing} have no @tool method in {self.path / 'executor.py'}'s "
                f"Executor (it implements {sorted(implemented)}); add the methods or remove the tools"
            )

    def _check_task(self, task: Task, where: str) -> None:
        check_split(task.split, where)
        unknown = sorted({n for n in task.tools if n not in self._tools})
        unknown += sorted({c.name for turn in task.reference for c in turn.calls if c.name not in self._tools})
        if unknown:
            raise DomainError(f"{where}: task {task.id!r} names tools that tools.json does not define: "
                              f"{sorted(set(unknown))} (defined: {sorted(t.name for t in self._tools)})")  # fmt: skip
        for k, turn in enumerate(task.reference):
            if len(turn.results) != len(turn.calls):
                raise DomainError(f"{where}: task {task.id!r} reference turn {k} has {len(turn.calls)} call(s) and "
                                  f"{len(turn.results)} result(s); give one result per call (null where unknown)")  # fmt: skip
            for call in turn.calls:
                error = self._tools.validate(call, task.tools or None).error
                if error is not None:
                    raise DomainError(f"{where}: task {task.id!r}: reference turn {k} calls {call.name!r}, which fails "
                                      f"validation: {error.message}; fix the reference or the tool's schema")  # fmt: skip
        if "state" in task.expected and self._executor_class is None and self._score is None:
            raise DomainError(
                f"{where}: task {task.id!r} checks expected.state, which replays the calls on a real executor; "
                f"add {self.path / 'executor.py'} (a ToolExecutor named Executor) or check 'calls' / 'answer_*'"
            )

    def _load_executor(self) -> type[ToolExecutor] | None:
        file = self.path / "executor.py"
        if not file.is_file():
            return None
        module = import_file(file, f"envace_user_domain_{self.name}")
        cls = getattr(module, "Executor", None)
        if not (isinstance(cls, type) and issubclass(cls, ToolExecutor)):
            raise DomainError(f"{file} must define a ToolExecutor subclass named Executor")
        return cls

    def _load_reward(self) -> Callable[[Task, Trajectory], Any] | None:
        file = self.path / "reward.py"
        if not file.is_file():
            return None
        score = getattr(import_file(file, f"envace_user_reward_{self.name}"), "score", None)
        if not callable(score):
            raise DomainError(f"{file} must define a function score(task, trajectory) returning a RewardResult, a "
                              "number in [0, 1], or None to mask the episode")  # fmt: skip
        return score

    def score(self, task: Task, trajectory: Trajectory) -> Any:
        """``reward.py``'s ``score`` when the folder has one, else the tasks' ``expected`` checks."""
        return super().score(task, trajectory) if self._score is None else self._score(task, trajectory)

    @property
    def tools(self) -> ToolRegistry:
        return self._tools

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self._tasks[check_split(split)]

    def make_executor(self, task: Task) -> ToolExecutor | None:
        return None if self._executor_class is None else self._executor_class(task.initial_state)

    def locate(self, task: Task | None = None) -> str:
        """Where ``task`` is written, ``tasks.jsonl:<line>: task '<id>'``; without one, ``tools.json``."""
        if task is None:
            return str(self.path / "tools.json")
        line = self._lines.get(task.id)
        return f"{self.path / 'tasks.jsonl'}{f':{line}' if line else ''}: task {task.id!r}"


def import_file(file: Path, name: str) -> Any:
    """Import the user's own ``file`` as module ``name`` (registered in ``sys.modules``, as an import would, so
    dataclasses and pickling inside it work)."""
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
