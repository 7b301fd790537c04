"""Domains: tools + tasks + reward + (optionally) a real executor.

A :class:`Domain` is mostly data. Its :class:`Task` objects carry the user turn(s), the tool whitelist,
the reference trajectory (calls *and* the real results they produced; the rehearse role's privileged
few-shot), and what the reward checks. The built-in domains live in ``envs/`` (installed as
``envace_gym.envs``); users register their own with :func:`register_domain`, pass a Domain object to
the environment, or point :func:`make_domain` at a folder (see :class:`FolderDomain`).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DomainError, EnvACEError, TaskNotFoundError, ToolError
from .executors import ToolExecutor, replay
from .parsing import call_key, canonical_json, format_act
from .tools import ToolCall, ToolRegistry

SPLITS = ("train", "test")


# ----------------------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReferenceTurn:
    """One assistant turn of a reference solution: tool calls with their real results, or an answer."""

    content: str = ""
    calls: tuple[ToolCall, ...] = ()
    results: tuple[Any, ...] = ()

    @property
    def text(self) -> str:
        """The Act text that writes this turn."""
        return format_act(self.content, self.calls)

    def to_dict(self) -> dict[str, Any]:
        return {"content": self.content, "calls": [c.to_json() for c in self.calls], "results": list(self.results)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReferenceTurn:
        calls = tuple(ToolCall(c["name"], dict(c.get("arguments", {}))) for c in data.get("calls", ()))
        return cls(data.get("content", ""), calls, tuple(data.get("results", ())))


@dataclass(frozen=True)
class Task:
    """One episode's worth of work.

    Attributes:
        id: ``"<domain>/<split>/<index>"`` for generated tasks; any unique string otherwise.
        domain: Name of the domain it belongs to.
        prompt: The first user message.
        split: ``"train"`` or ``"test"``.
        user_turns: Scripted follow-up user messages, each sent after the agent's next final answer.
        tools: The whitelist: names of the tools this task offers (empty: every tool of the domain).
        reference: The reference solution as assistant turns, with the real results of its calls.
        initial_state: The real executor's starting state.
        expected: What the reward checks (see :func:`score_expected`).
        system_prompt: Overrides the domain's system prompt for this task.
    """

    id: str
    domain: str
    prompt: str
    split: str = "train"
    user_turns: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    reference: tuple[ReferenceTurn, ...] = ()
    initial_state: Mapping[str, Any] = field(default_factory=dict)
    expected: Mapping[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None

    def reference_pairs(self) -> list[tuple[ToolCall, Any]]:
        """Every reference call with its real result, in order (calls whose result is unknown, ``None``, as
        in benchmarks that only judge the calls, are left out)."""
        return [
            (c, r) for turn in self.reference for c, r in zip(turn.calls, turn.results, strict=True) if r is not None
        ]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (nothing shared with the task)."""
        return copy.deepcopy(
            {
                "id": self.id,
                "domain": self.domain,
                "prompt": self.prompt,
                "split": self.split,
                "user_turns": list(self.user_turns),
                "tools": list(self.tools),
                "reference": [t.to_dict() for t in self.reference],
                "initial_state": dict(self.initial_state),
                "expected": dict(self.expected),
                "system_prompt": self.system_prompt,
            }
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], domain: str = "") -> Task:
        try:
            return cls(
                id=str(data["id"]),
                domain=data.get("domain", domain),
                prompt=data["prompt"],
                split=data.get("split", "train"),
                user_turns=tuple(data.get("user_turns", ())),
                tools=tuple(data.get("tools", ())),
                reference=tuple(ReferenceTurn.from_dict(t) for t in data.get("reference", ())),
                initial_state=data.get("initial_state", {}),
                expected=data.get("expected", {}),
                system_prompt=data.get("system_prompt"),
            )
        except (KeyError, TypeError) as exc:
            raise DomainError(f"malformed task record {str(data)[:120]}: missing or bad {exc}") from exc


class ReferenceRecorder:
    """Writes a reference solution by running it on the real executor, so recorded results are real.

    Example:
        >>> rec = ReferenceRecorder(BankTools(state))
        >>> acct = rec.call("find_account", owner="Ana Lima")        # runs it, records call + result
        >>> rec.answer(f"Your balance is {acct['balance']:.2f} USD.")
        >>> rec.turns                                                  # -> tuple of ReferenceTurn
    """

    def __init__(self, executor: ToolExecutor) -> None:
        self.executor = executor
        self._turns: list[ReferenceTurn] = []
        self._pending: list[tuple[ToolCall, Any]] = []

    def call(self, name: str, *, same_turn: bool = False, **arguments: Any) -> Any:
        """Run and record one call. Each call is its own Act turn unless ``same_turn`` (parallel calls)."""
        if not same_turn:
            self.end_turn()
        call = ToolCall(name, arguments)
        result = self.executor.execute(call)
        self._pending.append((call, result))
        return result

    def end_turn(self) -> None:
        """Close the current turn of calls."""
        if self._pending:
            calls, results = zip(*self._pending, strict=True)
            self._turns.append(ReferenceTurn("", tuple(calls), tuple(results)))
            self._pending = []

    def answer(self, text: str) -> None:
        self.end_turn()
        self._turns.append(ReferenceTurn(content=text))

    @property
    def turns(self) -> tuple[ReferenceTurn, ...]:
        self.end_turn()
        return tuple(self._turns)


# ----------------------------------------------------------------------------------------------------
# Trajectories and rewards
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CallRecord:
    """One tool call as the episode handled it."""

    turn: int
    call: ToolCall | None
    route: str | None  # "real", "cache", "rehearsal"; None when it failed before routing
    result: Any = None
    error: ToolError | None = None
    user_turn: int = 1  # which user turn the call answers (multi-turn rewards check turn by turn)

    @property
    def validated(self) -> bool:
        """The call passed format, whitelist and schema checks (its *answer* may still have failed)."""
        return self.route is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "id": self.call.id if self.call else None,
            "name": self.call.name if self.call else None,
            "arguments": dict(self.call.arguments) if self.call else None,
            "route": self.route,
            "result": self.result,
            "error": self.error.to_dict() if self.error else None,
            "validated": self.validated,
            "user_turn": self.user_turn,
        }


@dataclass(frozen=True)
class Trajectory:
    """What a reward sees: the task, the conversation, every call made and every final answer."""

    task: Task
    messages: tuple[Mapping[str, Any], ...]
    calls: tuple[CallRecord, ...]
    answers: tuple[str, ...]

    @property
    def valid_calls(self) -> list[ToolCall]:
        """The calls the agent validly made, in order: what a verifier replays. A call counts even when
        its rehearsal failed: that failure is the simulator's, not the agent's action."""
        return [r.call for r in self.calls if r.call is not None and r.validated]


@dataclass(frozen=True)
class RewardResult:
    """A reward with its reasons. ``score`` ``None`` means the verifier could not judge (masked, not 0)."""

    score: float | None
    checks: Mapping[str, bool] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        """Every check passed, and the episode was scored (a masked one is never a success)."""
        return self.score is not None and bool(self.checks) and all(self.checks.values())

    @classmethod
    def from_checks(cls, checks: Mapping[str, bool], weights: Mapping[str, float] | None = None) -> RewardResult:
        """Checklist reward (docs/method.md): ``sum(weight * passed) / sum(weight)``."""
        if not checks:
            return cls(None, {})
        w = {k: (weights or {}).get(k, 1.0) for k in checks}
        total = sum(w.values())
        return cls(sum(w[k] for k, ok in checks.items() if ok) / total if total else 0.0, dict(checks))


_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def numbers_in(text: str) -> list[float]:
    """Numbers written in ``text`` (``1,234.50`` → 1234.5)."""
    out = []
    for m in _NUMBER_RE.findall(text):
        try:
            out.append(float(m.replace(",", "")))
        except ValueError:
            continue
    return out


def score_expected(task: Task, trajectory: Trajectory, executor: ToolExecutor | None) -> RewardResult:
    """The programmatic checklist every built-in domain uses, driven by ``task.expected``:

    * ``"state"``: replaying the trajectory's valid calls into a fresh real executor ends in this state
      (τ²-Bench's database check; rehearsed calls are replayed too, so rehearsal mode is scored on what
      the agent *did*);
    * ``"calls"``: these calls (canonical name + arguments) were all made;
    * ``"answer_numbers"``: these numbers appear in the final answers (to 2 decimals);
    * ``"answer_contains"``: these strings appear in the final answers (case-insensitive).
    """
    expected = task.expected
    checks: dict[str, bool] = {}
    if "state" in expected:
        if executor is None:
            raise DomainError(f"task {task.id} checks a final state but its domain has no real executor")
        final = replay(executor, trajectory.valid_calls).snapshot()
        checks["state"] = canonical_json(final) == canonical_json(expected["state"])
    if "calls" in expected:
        made = {call_key(c) for c in trajectory.valid_calls}
        needed = [call_key(ToolCall(c["name"], c.get("arguments", {}))) for c in expected["calls"]]
        checks["calls"] = all(k in made for k in needed)
    answer = "\n".join(trajectory.answers)
    if "answer_numbers" in expected:
        found = [round(x, 2) for x in numbers_in(answer)]
        checks["answer_numbers"] = all(
            any(abs(f - round(float(n), 2)) <= 0.011 for f in found) for n in expected["answer_numbers"]
        )
    if "answer_contains" in expected:
        low = answer.lower()
        checks["answer_contains"] = all(str(s).lower() in low for s in expected["answer_contains"])
    return RewardResult.from_checks(checks, expected.get("weights"))


# ----------------------------------------------------------------------------------------------------
# Domains
# ----------------------------------------------------------------------------------------------------
class Domain:
    """Base class: a set of tools, a source of tasks, a reward, and optionally a real executor.

    Subclasses set ``name``, ``description``, ``system_prompt``, provide :attr:`tools` and :meth:`tasks`,
    and, for ``executor="real"``, :meth:`make_executor`. The default :meth:`score` is
    :func:`score_expected`.
    """

    name: str = ""
    description: str = ""
    system_prompt: str = "You are a helpful assistant. Use the tools when they help, then answer the user."
    max_turns: int = 12
    executes_calls: bool = True  # False when the real executor only acknowledges calls (nothing to rehearse toward)

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

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def stable_hash(text: str) -> int:
    """A process-independent hash (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class _LazyTasks(Sequence[Task]):
    """Tasks built on first access, in index order, and kept."""

    def __init__(self, domain: GeneratedDomain, split: str, size: int) -> None:
        self._domain, self._split, self._size = domain, split, size
        self._params: list[Any] = []
        self._built: dict[int, Task] = {}
        self._candidate = 0
        self._seen: set[str] = set()

    def __len__(self) -> int:
        return self._size

    def _params_for(self, index: int) -> Any:
        d = self._domain
        while len(self._params) <= index:
            rng = np.random.default_rng([d.seed, self._candidate])
            self._candidate += 1
            if self._candidate > 1000 * (self._size + 10):
                raise DomainError(f"{d.name}: cannot generate {self._size} distinct {self._split} tasks")
            params = d.sample_params(rng)
            key = d.task_key(params)
            if key in self._seen or d.split_of(key) != self._split:
                continue
            self._seen.add(key)
            self._params.append(params)
        return self._params[index]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError(index)
        if index not in self._built:
            params = self._params_for(index)
            self._built[index] = self._domain.build_task(
                params, f"{self._domain.name}/{self._split}/{index:03d}", self._split
            )
        return self._built[index]


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
        self._tasks = {s: _LazyTasks(self, s, int(self.num_tasks.get(s, 0))) for s in SPLITS}

    @property
    def tools(self) -> ToolRegistry:
        return self._tools

    def tasks(self, split: str = "train") -> Sequence[Task]:
        if split not in self._tasks:
            raise DomainError(f"unknown split {split!r}; use one of {SPLITS}")
        return self._tasks[split]

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


# ----------------------------------------------------------------------------------------------------
# Domains from files
# ----------------------------------------------------------------------------------------------------
class FolderDomain(Domain):
    """A domain described by files, for users who would rather write data than code.

    Folder layout::

        my_domain/
          domain.json     {"name": ..., "description": ..., "system_prompt": ..., "max_turns": ...}
          tools.json      a list of tools: OpenAI, MCP or BFCL form
          tasks.jsonl     one Task per line (see Task.to_dict); "split" says train or test
          executor.py     optional: a ToolExecutor subclass named Executor (enables executor="real")

    ``executor.py`` is the user's own code, imported like any module; model text is never executed.
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
        self._tasks: dict[str, list[Task]] = {s: [] for s in SPLITS}
        first_line: dict[str, int] = {}
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
                registry.add(spec)
            except EnvACEError as exc:
                raise DomainError(f"{file}: tool {i} ({name!r}): {exc}") from exc
        return registry

    def _check_executor_tools(self) -> None:
        if self._executor_class is None:
            return
        implemented = {t.name for t in self._executor_class.tool_schemas()}
        missing = [t.name for t in self._tools if t.name not in implemented]
        if missing:
            raise DomainError(
                f"{self.path / 'tools.json'}: {missing} have no @tool method in {self.path / 'executor.py'}'s "
                f"Executor (it implements {sorted(implemented)}); add the methods or remove the tools"
            )

    def _check_task(self, task: Task, where: str) -> None:
        if task.split not in SPLITS:
            raise DomainError(f"{where}: split {task.split!r} must be one of {list(SPLITS)}")
        unknown = sorted({n for n in task.tools if n not in self._tools})
        unknown += sorted({c.name for turn in task.reference for c in turn.calls if c.name not in self._tools})
        if unknown:
            raise DomainError(f"{where}: task {task.id!r} names tools that tools.json does not define: "
                              f"{sorted(set(unknown))} (defined: {sorted(t.name for t in self._tools)})")  # fmt: skip
        for k, turn in enumerate(task.reference):
            if len(turn.results) != len(turn.calls):
                raise DomainError(f"{where}: task {task.id!r} reference turn {k} has {len(turn.calls)} call(s) and "
                                  f"{len(turn.results)} result(s); give one result per call (null where unknown)")  # fmt: skip
        if "state" in task.expected and self._executor_class is None:
            raise DomainError(
                f"{where}: task {task.id!r} checks expected.state, which replays the calls on a real executor; "
                f"add {self.path / 'executor.py'} (a ToolExecutor named Executor) or check 'calls' / 'answer_*'"
            )

    def _load_executor(self) -> type[ToolExecutor] | None:
        file = self.path / "executor.py"
        if not file.is_file():
            return None
        module = _import_file(file, f"envace_user_domain_{self.name}")
        cls = getattr(module, "Executor", None)
        if not (isinstance(cls, type) and issubclass(cls, ToolExecutor)):
            raise DomainError(f"{file} must define a ToolExecutor subclass named Executor")
        return cls

    @property
    def tools(self) -> ToolRegistry:
        return self._tools

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self._tasks.get(split, [])

    def make_executor(self, task: Task) -> ToolExecutor | None:
        return None if self._executor_class is None else self._executor_class(task.initial_state)


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


def _import_file(file: Path, name: str) -> Any:
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


def _load_reference(ref: str) -> Any:
    """What ``"module:attr"`` or ``"path/to/file.py:attr"`` names, in the user's own code (imported as any
    module is; model text is never executed)."""
    where, _, attr = ref.rpartition(":")
    if where.endswith(".py"):
        file = Path(where)
        if not file.is_file():
            raise DomainError(f"domain {ref!r}: no file {where}")
        module = _import_file(file, f"envace_user_domain_{file.stem}")
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
    folder or object: :class:`~envace_gym.dataset_domain.DatasetDomain`, ``kwargs`` such as ``format=``), or a
    reference into the user's code, ``"module:attr"`` / ``"file.py:attr"``."""
    if isinstance(domain, Domain):
        return domain
    from .dataset_domain import DatasetDomain, is_dataset_source

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
