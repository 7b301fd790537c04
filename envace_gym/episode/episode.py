"""One episode of world rehearsal, independent of the Gymnasium API and of how text is generated.

:meth:`Episode.play_turn` is a generator: it takes the agent's Act turn, does everything that needs no model
(parse, validate, route, real or cached answers), *yields* the generations it needs (rehearsals), gets them
sent back, and returns a :class:`StepOutcome`. An :class:`~envace_gym.episode.driver.EpisodeDriver` answers the
yields: for one episode (:class:`~envace_gym.env.RehearsalEnv`) or for many in one batched call per round (the
vector env, the rollout collector, the planner's imagined episodes). The logic reads top to bottom as
docs/method.md ("Roll-out") describes it:

    Act turn → parse → validate (format, whitelist, schema) → route each call
             → real executor | reference cache | Rehearse (the policy)
             → tool messages → next Act prompt, or a scripted user turn, or the end and the reward.

The Rehearse role's part of a turn is its rehearsal mode's (:data:`TOOL_TURNS`); the conversation, as token ids
that only grow, and the turn's counters are the :class:`~envace_gym.episode.transcript.Transcript`, whose mark
undoes a failed turn.

The episode is the one owner of its state: the modules it calls (:mod:`.acts`, :mod:`.endings`, :mod:`.routes`,
:mod:`.user_turns`, the rehearsal modes) compute and return decisions (a row, an :class:`~.endings.Ending`, the
answered calls), which the episode applies. Every way an episode ends goes through :meth:`Episode._end`; the rules
a simulated user's protocol sets (bounds, opening, scoring of a cut run) are asked of its
:class:`~envace_gym.domains.user_protocol.UserProtocol`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Generator, Hashable
from dataclasses import replace
from typing import Any

import numpy as np

from ..domains.domain import Domain
from ..domains.reward import RewardResult
from ..domains.task import Task
from ..domains.trajectory import CallRecord, Trajectory
from ..domains.user_protocol import ENVACE_PROTOCOL, OPENING, EpisodeRules
from ..errors import DomainError, EnvACEError, ErrorCode, PolicyError, TaskTooLongError, ToolError
from ..parsing.formats import strip_think, tool_call_format
from ..policy.protocol import Generation
from ..text import clean_text
from ..tools.budget import StepBudget
from ..tools.executor import ReferenceCache
from ..tools.schema import ToolCall
from . import inline, separate
from .acts import act_ids, act_record
from .chat import ChatFormat
from .config import MAX_OBSERVATION_CHARS, EpisodeConfig
from .endings import (
    Ending,
    at_bound,
    bound_reached,
    environment_failed,
    finished,
    invalid_call,
    next_ending,
    score,
    user_failed,
)
from .responses import dump, payload, tool_message
from .routes import answer_without_model
from .transcript import Mark, Transcript
from .types import CallState, GenerationRequest, Row, StepOutcome
from .user_turns import answer_user_calls, user_info, user_row
from .users import UserReply, UserRequest, UserSimulator

logger = logging.getLogger("envace_gym")

# What a step asks for (a generation: rehearsals; a simulated user's turn) and gets back, in order.
Request = GenerationRequest | UserRequest
Answer = Generation | UserReply
TurnCoroutine = Generator[list[Request], list[Answer], StepOutcome]

# Each rehearsal mode's tool turn (its module says what it does), by its name in config.REHEARSAL_MODES.
TOOL_TURNS = {"separate": separate.tool_turn, "inline": inline.tool_turn}
NOTHING_MORE = "I have nothing more to do."  # the Act turn of a reference replay past the reference solution


class Episode:
    """The state of one episode: conversation (as messages and as ids), real executor, scripted users, records.

    Args:
        domain: The domain (tools, reward, executor).
        task: The task being played.
        config: Episode rules.
        tokenizer: The policy's tokenizer (its chat template lays out the conversation).
        rng: A ``np_random``: every random choice of the episode (task routing in ``mixed``) comes from it.
        max_context: The policy's token budget (prompt + completion).
        act_max_new_tokens: Tokens reserved for the next Act turn in the context guard: the episode is
            truncated once fewer are left. A driver that generates the Act turns reserves its generation
            budget; one that replays text can reserve 0, since a text turn that does not fit ends the
            episode (``truncation="context"``) when it arrives.
        key: Names this conversation for KV-cache reuse (see :mod:`envace_gym.policy.sessions`).
        max_observation_chars: The longest the conversation's text (the observation) may grow: a message that
            would make it longer is not kept and ends the episode (``truncation="context"``).
        user: A simulated user (:class:`~envace_gym.episode.users.UserSimulator`) that answers each final answer
            of the agent, instead of the task's scripted user turns; ``None``: scripted.
        opening: The user's first message, when the simulated user writes it (a task with a scenario of its own:
            see :meth:`~envace_gym.episode.users.UserSimulator.writes_opening`); a reply that cannot be used (or a
            stop marker) leaves the task's own prompt in its place, with ``info["user_opening_error"]`` saying why;
            under a protocol whose ``failed_opening_fails`` the first step then ends the run as the user's failure
            (``"user_error"``).

    Raises:
        TaskTooLongError: The task's opening prompt does not fit: with ``act_max_new_tokens`` (at least one) left
            for the Act turn in ``max_context``, and in ``max_observation_chars``.
    """

    def __init__(
        self,
        domain: Domain,
        task: Task,
        config: EpisodeConfig,
        tokenizer: Any,
        rng: np.random.Generator,
        *,
        max_context: int = 8192,
        act_max_new_tokens: int = 512,
        key: Hashable | None = None,
        max_observation_chars: int = MAX_OBSERVATION_CHARS,
        user: UserSimulator | None = None,
        opening: UserReply | None = None,
    ) -> None:
        self.domain, self.task, self.config, self.tokenizer, self.rng = domain, task, config, tokenizer, rng
        self.max_context, self.act_max_new_tokens, self.key = max_context, act_max_new_tokens, key
        self.max_observation_chars, self.user = max_observation_chars, user
        self.chat = ChatFormat.of(tokenizer)
        self.tool_format = tool_call_format(
            tokenizer, config.tool_call_format, self.chat.generation_prompt, self.chat.end_texts
        )
        self.registry = domain.tools_for(task)  # most domains share one registry; some tasks bring their own
        self.whitelist = domain.whitelist(task)
        self.tools_openai = self.registry.to_openai(self.whitelist, compact=True)  # the Act prompt's tools
        self.candidates = [self.registry[n] for n in self.whitelist]
        # A user with tools of its own (say, one who holds a phone): its calls are checked against these, run on
        # the user's side of the world and shown to the user only.
        self.user_registry = domain.user_tools_for(task) if user is not None else None
        self.user_tools = tuple(self.user_registry.to_openai(compact=True)) if self.user_registry is not None else ()
        self.executor = None
        if config.executor in ("real", "mixed"):
            self.executor = domain.make_executor(task)
            if self.executor is None:
                raise DomainError(f"domain {domain.name!r} has no real executor; use executor='rehearsal' or 'cached'")
        self.cache = ReferenceCache(task.reference_pairs()) if config.executor == "cached" else None
        self.reference_pairs = task.reference_pairs()
        self.protocol = (user.protocol if user is not None else None) or ENVACE_PROTOCOL
        asked = EpisodeRules(config.on_invalid, config.max_turns, config.max_user_turns, config.max_messages,
                             config.max_errors)  # fmt: skip
        rules = self.protocol.rules(asked, domain.max_turns)
        self.on_invalid, self.max_turns, self.max_user_turns = rules.on_invalid, rules.max_turns, rules.max_user_turns
        self.max_messages, self.max_errors = rules.max_messages, rules.max_errors
        self.termination_reason: str | None = None  # why it ended (in a benchmark's words, where its protocol has them)
        self.opening_error: str | None = None
        self.user_error: str | None = None  # why the simulated user's reply could not be used (the end, masked)
        if opening is not None and not opening.text:
            self.opening_error = opening.error or f"the user ended the conversation ({opening.stop}) before it began"
            logger.warning("episode of %s opens with the task's prompt: %s", task.id, self.opening_error)
        first = opening.text if opening is not None and opening.text else task.prompt
        messages = [{"role": "system", "content": clean_text(task.system_prompt or domain.system_prompt)}]
        if opening is not None and self.protocol.greets:  # the greeting the user answered opens both views
            messages.append({"role": "assistant", "content": OPENING})
        messages.append({"role": "user", "content": clean_text(first)})
        # The conversation as ids: rendered and tokenized once here, then only appended to.
        text = self.chat.render(self.chat.safe_messages(messages), self.tools_openai)
        self._refuse_if_too_long(len(text), tokens=0)  # by its characters first: a text of any length is not tokenized
        ids = self.chat.encode(text)
        self._refuse_if_too_long(len(text), tokens=len(ids))
        self.transcript = Transcript(messages, ids, text)
        # What a simulated user sees: the user's own turns and the agent's answers without reasoning; never a call,
        # its raw text when malformed, a tool's result nor an error.
        self.user_view: list[dict[str, str]] = [messages[-1]]
        if opening is not None and self.opening_error is None:
            self._keep_user_row(opening)
        self.scripted_turns = tuple(clean_text(turn) for turn in task.user_turns)  # the later user turns, in order
        if (self.scripted_turns or user is not None) and self.chat.user_turns_ok is not None:
            raise PolicyError(
                f"task {task.id!r} has {len(self.scripted_turns)} later user turn(s)"
                f"{' and a simulated user' if user is not None else ''}, but this chat template rewrites earlier turns "
                f"once a new user turn follows (Qwen3.5 drops their <think> blocks), so the "
                f"conversation cannot grow by appending ids ({self.chat.user_turns_ok}); play single-turn tasks, "
                "or use a template that keeps past turns as they were"
            )
        self.done = False
        self.scored = True  # False for imagined episodes: their outcome is for the agent to judge, not the verifier
        self.reward_result: RewardResult | None = None
        self.budget = StepBudget(config.limits.max_check_seconds)  # renewed by each step
        self.overflowed = False  # a message did not fit the observation: the episode ends for context

    def _refuse_if_too_long(self, chars: int, tokens: int) -> None:
        reserve = max(self.act_max_new_tokens, 1)
        if chars > self.max_observation_chars:
            why = f"its opening prompt is {chars} characters, past the observation space's {self.max_observation_chars}"
        elif tokens + reserve > self.max_context:
            why = (f"its opening prompt is {tokens} tokens and the policy's context holds {self.max_context}, "
                   f"{reserve} of them kept for the Act turn")  # fmt: skip
        else:
            return
        raise TaskTooLongError(
            self.task.id, f"task {self.task.id!r} cannot be played: {why}; shorten it or use a model with a longer "
            "context (collectors, SFT and evaluation skip such tasks and count them)",
        )  # fmt: skip

    def _fits(self, tokens: int, chars: int) -> bool:
        """Whether ``tokens`` ids showing ``chars`` characters can join the conversation."""
        return (len(self.prompt_ids) + tokens <= self.max_context
                and len(self.prompt_text) + chars <= self.max_observation_chars)  # fmt: skip

    # -- views ----------------------------------------------------------------------------------------
    @property
    def turn(self) -> int:
        """Act turns so far."""
        return self.transcript.turn

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation as messages (the transcript's: append to it only through a step)."""
        return self.transcript.messages

    @property
    def prompt_ids(self) -> list[int]:
        """The next Act prompt's ids."""
        return self.transcript.prompt_ids

    @property
    def prompt_text(self) -> str:
        return self.transcript.prompt_text

    @property
    def rows(self) -> list[Row]:
        """The training rows made so far (``separate`` mode: one per generation; a rehearsed user's)."""
        return self.transcript.rows

    @property
    def records(self) -> list[CallRecord]:
        return self.transcript.records

    @property
    def answers(self) -> list[str]:
        return self.transcript.answers

    def observation(self) -> str:
        """The next Act prompt as text (its ids are :attr:`prompt_ids`). It spells a special token only where
        the ids hold one: special-token strings that the conversation holds as plain text are broken by a
        zero-width space, so tokenizing the observation cannot open or re-role a turn."""
        return self.prompt_text

    def trajectory(self) -> Trajectory:
        return Trajectory(
            self.task, tuple(copy.deepcopy(self.messages)), tuple(self.records), tuple(self.answers),
            tuple(self.transcript.said),
        )  # fmt: skip

    def episode_row(self) -> Row:
        """The whole episode as one row (``inline`` mode's training row; in ``separate`` mode, the Act
        tokens are marked and rehearsals, which happened outside the chat, are absent)."""
        return self.transcript.episode_row()

    def base_info(self) -> dict[str, Any]:
        return {
            "task_id": self.task.id,
            "turn": self.transcript.turn,
            "executor": self.config.executor,
            "rehearsal_mode": self.config.rehearsal_mode,
            "messages": copy.deepcopy(self.messages),
            **({"user_opening_error": self.opening_error} if self.opening_error else {}),
        }

    # -- the turn -------------------------------------------------------------------------------------
    def play_turn(self, action: str, act: Generation | None = None) -> TurnCoroutine:
        """Play one Act turn, as a coroutine for a driver to run. ``act`` is the generation that wrote ``action``,
        when there is one (its ids and log-probs are kept as they are); otherwise ``action`` is tokenized. Yields
        generation requests; returns the outcome.

        Whatever the environment's own parts raise during the turn (a tokenizer, a registry, a custom
        domain's code) undoes the whole turn and ends the episode as truncated with its reward masked and
        ``info["error"]`` an ``ENVIRONMENT_ERROR``: the episode never keeps half a turn.
        """
        if self.done:
            raise EnvACEError("this episode is over; call reset() before step()")
        mark = self.transcript.mark()
        info: dict[str, Any] = {"tool_calls": [], "calls": [], "rehearsals": [], "error": None}
        try:
            ending = yield from self._turn(clean_text(action) if isinstance(action, str) else action, act, info)
            return self._outcome(0.0, False, False, info) if ending is None else self._end(ending, info)
        except Exception as exc:
            return self._abort(mark, exc)

    def _turn(
        self, action: str, act: Generation | None, info: dict[str, Any]
    ) -> Generator[list[Request], list[Answer], Ending | None]:
        """The turn itself: its :class:`~.endings.Ending`, or ``None`` when the episode goes on."""
        t = self.transcript
        if self.opening_error is not None and self.protocol.failed_opening_fails:  # a user who could not open
            return user_failed(self.opening_error)
        if act is not None and self.tool_format.act_tokens:  # the format's own special tokens are part of the call
            action = self.chat.act_view(act.completion_ids, self.tool_format.act_tokens)
        # Parsing, validation, routing and result checks share one time budget (Limits.max_check_seconds).
        self.budget = StepBudget(self.config.limits.max_check_seconds)
        with self.budget:
            parsed = self.tool_format.parse(action, self.config.limits, self._parameters)
        # A text turn ends as the template ends the message that follows it (GLM: <|observation|> before a tool
        # message, the error of a malformed call included).
        answered_by_tool = bool(parsed.calls) or (parsed.error is not None and self.chat.error_role == "tool")
        ids, logprobs = act_ids(self, action, act, answered_by_tool)
        shown = self.chat.display(ids)
        if not self._fits(len(ids), len(shown)):  # the turn itself does not fit: nothing of it is kept
            info["act"] = None
            return finished("context")
        t.turn += 1
        t.steps += 1
        row, info["act"] = act_record(tuple(self.prompt_ids), ids, logprobs, act)
        if row is not None:
            t.rows.append(row)
        self.append_ids(ids, shown, logprobs, trained=True)  # the Act turn joins the conversation (trained tokens)
        t.turn_open = not ids or ids[-1] not in self.chat.stop_ids
        calls = [replace(c, id=f"call_{t.turn}_{i}") for i, c in enumerate(parsed.calls)]
        text = action[: self.config.limits.max_action_chars] if isinstance(action, str) else ""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls and parsed.error is None:
            message["tool_calls"] = [c.to_openai() for c in calls]
        self.messages.append(message)
        info["tool_calls"] = [c.to_json() for c in calls]

        if parsed.error is not None:  # a malformed turn: nothing of it is executed
            t.steps += 1  # its error message answers it, as a tool's would
            self.records.append(CallRecord(t.turn, None, None, error=parsed.error, user_turn=t.user_turns))
            self.add_messages(
                [{"role": self.chat.error_role, "name": "", "content": dump(parsed.error.to_payload())}]
            )
            return self._after_errors([parsed.error], info)

        if parsed.content.strip():
            t.said.append(parsed.content)
        if parsed.is_final_answer:
            self.answers.append(parsed.content)
            self.user_view.append({"role": "assistant", "content": strip_think(parsed.content).strip()})
            if self.user is not None:
                return (yield from self._user_turn(self.user, info))
            if t.user_turns > len(self.scripted_turns):  # (the opening is user turn 1)
                return finished("agent_stop")
            turn = {"role": "user", "content": self.scripted_turns[t.user_turns - 1]}
            self.add_messages([turn])
            self.user_view.append(turn)
            t.user_turns += 1
            return next_ending(self)

        # Validate every call before answering any: an invalid call ends the turn cheaply.
        states = [CallState(call) for call in calls]
        with self.budget:
            for state in states:
                state.error = self.registry.validate(state.call, self.whitelist).error
        invalid = [s.error for s in states if s.error is not None]
        t.steps += 1  # the tool responses to the turn's calls: one message (max_messages counts them so)
        if invalid and self.on_invalid == "terminate":
            self.records.extend(
                CallRecord(t.turn, s.call, None, error=s.error, user_turn=t.user_turns) for s in states
            )
            info["calls"] = [r.to_dict() for r in self.records[-len(calls) :]]
            self.add_messages(
                [tool_message(s.call, s.error.to_payload()) for s in states if s.error is not None], calls
            )
            return self._after_errors(invalid, info)

        failures = getattr(self.executor, "failures", 0)
        for state in states:
            if state.error is None:
                answer_without_model(self, state)
        t.errors += getattr(self.executor, "failures", 0) - failures  # a tool that refused (ToolFailure)

        # the Rehearse role's turn: it answers the calls routed to it and grows the chat by the tool turn
        t.rows += yield from TOOL_TURNS[self.config.rehearsal_mode](self, states, text, info)

        self.records.extend(
            CallRecord(t.turn, s.call, s.route, s.response, s.error, t.user_turns) for s in states
        )
        info["calls"] = [r.to_dict() for r in self.records[-len(calls) :]]
        errors = [s.error for s in states if s.error is not None]
        if errors:
            return self._after_errors(errors, info)
        return next_ending(self)

    def _after_errors(self, errors: list[ToolError], info: dict[str, Any]) -> Ending | None:
        """A turn with errors: the end under ``on_invalid="terminate"`` (reward 0), else the episode goes on."""
        info["error"] = errors[0].to_dict()
        self.transcript.errors += len(errors)
        return invalid_call() if self.on_invalid == "terminate" else next_ending(self)

    # -- a simulated user's turn -----------------------------------------------------------------------
    def _user_turn(
        self, user: UserSimulator, info: dict[str, Any]
    ) -> Generator[list[Request], list[Answer], Ending | None]:
        """The simulated user answers the agent's final answer: a message (context, never trained as the agent's), a
        stop marker (the end: the reward is scored), or a reply that cannot be used (the end, masked: not the agent's
        fault). A user with tools of its own may first call them, as often as it likes: each time the results go
        back to it (:func:`~.user_turns.answer_user_calls`) and it is asked again."""
        t = self.transcript
        if self.max_user_turns is not None and t.user_turns >= self.max_user_turns:
            return finished("max_user_turns")
        while True:
            bound = bound_reached(self)  # the message and error bounds are checked before the user answers, too
            if bound is not None:
                return at_bound(bound)
            (reply,) = yield [UserRequest(user, self.task, tuple(self.user_view), self.user_tools)]
            t.steps += 1
            info["user"] = user_info(reply)
            self._keep_user_row(reply)
            if reply.error is not None:
                return user_failed(reply.error)
            if not reply.calls:
                break
            # The user's calls of its own tools: they and their results join the user's view only; a refused or
            # failed call counts as a tool error (max_errors).
            answered = yield from answer_user_calls(self, reply, info)
            t.steps += 1  # the tool responses: one message
            t.errors += answered.failures + sum(s.error is not None for s in answered.states)
            t.rows += answered.rows
            records = [CallRecord(t.turn, s.call, s.route, s.response, s.error, t.user_turns, requestor="user")
                       for s in answered.states]  # fmt: skip
            t.records.extend(records)
            info.setdefault("user_calls", []).extend(r.to_dict() for r in records)
            calls = [s.call.to_openai() for s in answered.states]
            self.user_view.append({"role": "user", "content": reply.text, "tool_calls": calls})
            self.user_view += [tool_message(s.call, payload(s)) for s in answered.states]
        if reply.stop is not None:
            bound = bound_reached(self)  # the bound check follows the stop and overrides it
            return at_bound(bound) if bound is not None else finished("user_stop")
        self.add_messages([{"role": "user", "content": reply.text}])
        self.user_view.append({"role": "user", "content": reply.text})
        t.user_turns += 1
        return next_ending(self)

    def _keep_user_row(self, reply: UserReply) -> None:
        row = user_row(self.user, reply)
        if row is not None:
            self.transcript.rows.append(row)

    # -- the end --------------------------------------------------------------------------------------
    def _end(self, ending: Ending, info: dict[str, Any]) -> StepOutcome:
        """The one place an episode ends, whichever way (:mod:`.endings` builds each): the agent's final answer after
        the last scripted user turn (``agent_stop``) or the user's stop marker (``user_stop``), scored; a turn, user
        turn or context limit (``max_turns``, ``max_user_turns``, ``context``: truncated), scored unless the user's
        protocol gives a cut run 0; an invalid call under ``on_invalid="terminate"`` (``invalid_call``) or a message
        or error bound (``max_steps``, ``too_many_errors``), at 0; a user's reply that cannot be used
        (``user_error``) or the environment's own failure (``environment_error``), masked. An imagined episode
        (:meth:`fork`) is never scored: its reward is masked."""
        self.done, self.termination_reason = True, ending.reason
        if ending.cut:
            info["truncation"] = ending.reason
        if ending.user_error is not None:
            logger.warning("episode of %s masked: %s", self.task.id, ending.user_error)
            self.user_error = info["user_error"] = ending.user_error
        reward = ending.reward
        if reward is None and not self.scored:
            reward = RewardResult(None, {})
        elif reward is None and ending.truncated and not self.protocol.scores_cut_runs:
            reward = RewardResult(0.0, {})
        elif reward is None:
            reward, error = score(self)
            if error is not None:
                info["reward_error"] = error
        self.reward_result = reward
        return self._outcome(0.0 if reward.score is None else float(reward.score), not ending.truncated,
                             ending.truncated, info)  # fmt: skip

    def _abort(self, mark: Mark, exc: Exception) -> StepOutcome:
        """The environment's own code failed during a turn: the turn undone back to ``mark``, the episode ended as
        truncated with its reward masked and an ``ENVIRONMENT_ERROR``."""
        self.transcript.rollback(mark)
        error = ToolError(
            ErrorCode.ENVIRONMENT_ERROR,
            f"the environment failed during this turn ({type(exc).__name__}: {exc}); the turn was undone"[:300],
            {"exception": type(exc).__name__},
            source="environment",
        )
        logger.warning("episode of %s ended: %s", self.task.id, error.message, exc_info=exc)
        info = {"tool_calls": [], "calls": [], "rehearsals": [], "error": error.to_dict(), "act": None}
        return self._end(environment_failed(), info)

    def _outcome(self, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepOutcome:
        """The step's outcome, with what ``info`` says of every step (and of the end, once there is one)."""
        info.update(self.base_info())
        if self.done:
            info["termination_reason"] = self.termination_reason
        if self.done and self.reward_result is not None:
            info["reward_checks"] = dict(self.reward_result.checks)
            info["reward_masked"] = self.reward_result.score is None
            if self.reward_result.note:
                info["reward_note"] = self.reward_result.note
            info["success"] = self.reward_result.success
        return StepOutcome(self.prompt_text, reward, terminated, truncated, info)

    # -- an imagined copy -----------------------------------------------------------------------------
    def fork(self, config: EpisodeConfig, rng: np.random.Generator, note: str | None = None) -> Episode:
        """A private copy of the conversation so far, played on under ``config`` (say, every call rehearsed):
        nothing done in it reaches this episode or its executor. It knows no future user turn (a final answer ends
        it) and it is not scored: the verifier's view of the task is not the agent's. A ``note`` (say, a planner's
        memory) is placed before the copy's next Act turn (:meth:`prompt_with_note`)."""
        twin = copy.copy(self)
        twin.config, twin.rng, twin.key = config, rng, None
        twin.executor = None if config.executor == "rehearsal" else self.domain.make_executor(self.task)
        twin.cache = None
        # the copy records only what happens in it, from its prompt on (with the note)
        twin.transcript = self.transcript.fork(self.prompt_with_note(note) if note is not None else None)
        twin.scripted_turns, twin.scored, twin.done, twin.reward_result = (), False, False, None
        twin.user = None
        twin.user_view = list(self.user_view)  # its final answers are its own: the real user never sees them
        twin.on_invalid = config.on_invalid or self.on_invalid
        twin.max_turns = self.turn + (config.max_turns or self.max_turns or self.domain.max_turns)
        return twin

    def prompt_with_note(self, note: str, role: str = "system") -> tuple[list[int], str]:
        """The next Act prompt (ids, text) with a private note inserted just before the assistant's turn; the
        episode itself is unchanged."""
        opening, tail = self.chat.generation_prompt, self.chat.generation_prompt_ids
        if not self.prompt_text.endswith(opening) or self.prompt_ids[-len(tail) :] != tail:
            raise EnvACEError("the prompt does not end with the template's generation prompt")
        insert = self.chat.insertion([{"role": role, "content": self.chat.neutralize(clean_text(note))}]) + opening
        return self.prompt_ids[: -len(tail)] + self.chat.encode(insert), self.prompt_text[: -len(opening)] + insert

    # -- growing the conversation ---------------------------------------------------------------------
    def append_ids(self, ids: list[int], text: str, logprobs: list[float] | None, trained: bool) -> None:
        self.transcript.append(ids, text, logprobs, trained)

    def append_text(self, text: str) -> None:
        self.append_ids(self.chat.encode(text), text, None, trained=False)

    def keep_message(self, message: dict[str, Any]) -> None:
        """A message joins the messages only: its ids are appended on their own (``inline``'s tool turn writes them
        as it generates)."""
        self.transcript.messages.append(message)

    def close_turn(self, end: str) -> None:
        """An Act turn cut by the token budget still needs its end token (``end``) before anything follows; so does
        one that stopped on another stop token where ``end`` opens the next message (GLM's role tokens)."""
        end_ids = self.chat.encode(end)
        reopen = self.chat.end_opens_turn and self.transcript.ids[-len(end_ids) :] != end_ids
        if self.transcript.turn_open or reopen:
            self.append_ids(end_ids, end, None, trained=False)
            self.transcript.turn_open = False

    def add_messages(self, messages: list[dict[str, Any]], calls: list[ToolCall] = ()) -> None:  # type: ignore[assignment]
        """Append tool or user messages after the Act turn that made ``calls``, as messages and as ids; messages
        whose text would take the observation past ``max_observation_chars`` are not kept and end the episode."""
        # The template sees the calls' names (gpt-oss names a tool message's author by them), never their arguments.
        named = [
            {"type": "function", "function": {"name": self.chat.neutralize(c.name), "arguments": {}}} for c in calls
        ]
        end, rest = self.chat.suffix(self.chat.safe_messages(messages), named)
        if not self._fits(0, len(end) + len(rest)):  # (its tokens are counted once encoded, by _continue)
            self.overflowed = True
            return
        self.transcript.messages += messages
        self.close_turn(end)
        self.append_text(rest)

    def _parameters(self, name: str) -> Any:
        """The parameters schema of tool ``name`` (the XML formats type their arguments by it)."""
        return self.registry[name].parameters if name in self.registry else None

    def reference_action(self, turn: Any) -> str:
        """The Act text of a reference turn (:class:`~envace_gym.domains.ReferenceTurn`) in this model's own
        format, as its chat template writes such a turn (its end token is added when it is stepped)."""
        return self.chat.strip_end(self.chat.act_text(turn.content, [c.to_openai() for c in turn.calls]))

    def reference_act(self) -> str:
        """The Act text of the task's reference turn for the current turn (:meth:`reference_action`), or
        :data:`NOTHING_MORE` once the reference solution has no turn left."""
        turns = self.task.reference
        return self.reference_action(turns[self.transcript.turn]) if self.transcript.turn < len(turns) else NOTHING_MORE
