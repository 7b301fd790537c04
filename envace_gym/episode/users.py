"""Simulated users: an LLM plays the user of a multi-turn task, as benchmarks of conversational agents score them.

A scripted user replays the task's later user turns whatever the agent says. A :class:`UserSimulator` instead
holds the task's scenario privately and answers each of the agent's text turns, seeing the conversation from
its own side: its own messages as the assistant's, the agent's answers as the user's (their content only: no
reasoning, no tool call, no malformed call's text, no tool result and no error). It ends the conversation with one
of its protocol's stop markers (:data:`~envace_gym.domains.user_protocol.STOP_MARKERS`): ``###STOP###`` when the
request is done or cannot be done, ``###TRANSFER###`` when it was handed to a human, ``###OUT-OF-SCOPE###`` when
the scenario does not say what to answer. Where the task carries a scenario of its own
(``task.expected["user_scenario"]``), the user also writes the conversation's first message, after the agent's
greeting (:data:`~envace_gym.domains.user_protocol.OPENING`).

Where the domain gives the user tools of its own (``Domain.user_tools_for``: a user who holds a phone), the user is
offered them: a reply may be tool calls instead of a message (:attr:`UserReply.calls`). The episode runs them on
the user's side of the world (validated like the agent's, answered by the real executor or rehearsed by the policy)
and asks the user again, with the results, until it writes to the agent; the agent never sees the user's calls nor
their results.

The rules a user plays by are its protocol's (:class:`~envace_gym.domains.user_protocol.UserProtocol`, named by
``UserSimulator(protocol=...)``; a domain names its own default, ``Domain.user_protocol``): its system prompt, its
sampling, and the episode's bounds and scoring. This project's own protocol is the base class's (a short
instruction; sampled replies; the agent's Act-turn bound); a benchmark
with a user of its own defines its protocol in its folder under ``envs/``.

The user is a participant, like the policy: an episode asks for its turn with a :class:`UserRequest`, the
:class:`~envace_gym.episode.driver.EpisodeDriver` gathers the requests of a round and asks each simulator once
(:meth:`UserSimulator.respond`), and the episode gets a :class:`UserReply` back. Its turns enter the agent's
conversation as context, never trained as the agent's. Its model is any :class:`~envace_gym.policy.Policy` (a
second model, the embedded default model, or the policy itself, whose own tokenizer renders the user's prompts)
or a chat endpoint (:class:`~envace_gym.endpoint.ChatEndpoint`). With ``trained=True`` (``user="rehearse"``) the
policy rehearses its users: each of their generations is also a training row of role ``"user"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..domains.task import Task
from ..domains.user_protocol import ENVACE_PROTOCOL, NO_BUDGET, OPENING, UserProtocol
from ..endpoint import ChatBackend, ChatEndpoint
from ..errors import DomainError
from ..parsing.formats import tool_call_format
from ..policy.protocol import Generation, Policy, SamplingParams
from ..text import clean_text, strict_loads
from ..tools.schema import ToolCall
from .chat import ChatFormat

USERS = ("scripted", "llm", "rehearse")  # the named settings of ``user=``; a URL is an endpoint
# Seconds a user endpoint may take per reply: a round's replies queue on a local server that answers one at a time
# (`transformers serve`), and a user with no reply budget may write long; at the endpoint's default (60 s) they
# timed out.
USER_ENDPOINT_TIMEOUT = 600.0


def own_scenario(task: Task) -> str | None:
    """The scenario the task carries for a simulated user (``task.expected["user_scenario"]``), if any."""
    given = task.expected.get("user_scenario") if isinstance(task.expected, Mapping) else None
    return given if isinstance(given, str) and given.strip() else None


def task_scenario(task: Task) -> str:
    """What the user knows and wants: the task's own scenario (:func:`own_scenario`), else the opening request and
    the later scripted user turns, as what the user may go on to say."""
    given = own_scenario(task)
    if given is not None:
        return given
    lines = [f"Your request, which you have already written: {task.prompt}"]
    if task.user_turns:
        lines.append("What you may go on to say, when it fits what the assistant says:")
        lines += [f"- {turn}" for turn in task.user_turns]
    return "\n".join(lines)


@dataclass(frozen=True)
class UserReply:
    """What the simulator said: ``text`` (a message for the agent), or ``calls`` (calls of its own tools, to run
    before it writes to the agent; ``text`` is then what it wrote beside them, kept in its own view only), or ``stop`` (a
    marker that ends the conversation), or ``error`` (a reply that cannot be used: the episode is masked).
    ``generation`` is what a policy-backed user generated (its ids and log-probs: the ``"user"`` row when it is
    trained)."""

    text: str = ""
    stop: str | None = None
    error: str | None = None
    generation: Generation | None = None
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class UserRequest:
    """An episode asking its simulated user for a turn: the task, the conversation so far as the user may see
    it (the episode's ``user_view``; empty: the user writes the opening) and the user's own tools (OpenAI
    schemas; none for most domains)."""

    user: UserSimulator
    task: Task
    conversation: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()


@dataclass(eq=False)
class UserSimulator:
    """An LLM user for ``RehearsalEnv(user=...)`` and ``collect_rollouts(user=...)``, playing by its protocol's rules.

    Args:
        model: Writes the user's turns: a :class:`~envace_gym.policy.Policy` (its own tokenizer and chat
            template render the prompts; its turns are token-exact and can be trained) or a chat backend such as
            :class:`~envace_gym.endpoint.ChatEndpoint` (its own sampling settings apply; a request that fails is
            an unusable reply).
        sampling: How a policy samples the user's turns (its ``max_new_tokens`` bounds a turn: a reply cut there
            is refused; :data:`NO_BUDGET`: no bound but its model's context). ``None``: the protocol's
            (``UserProtocol.sampling``).
        instructions: The system prompt; ``{scenario}`` is replaced by :func:`task_scenario`'s text. ``None``: the
            protocol's (``UserProtocol.instructions``).
        trained: The policy rehearses its users: each user generation is a training row of role ``"user"``
            (``user="rehearse"``; ``model`` must be the policy being trained).
        protocol: A :class:`~envace_gym.domains.user_protocol.UserProtocol`: the user's defaults here, and the rules
            of the episodes it plays. ``None``: the domain's (``Domain.user_protocol``), once it plays one.
    """

    model: Policy | ChatBackend
    sampling: SamplingParams | None = None
    instructions: str | None = None
    trained: bool = False
    protocol: UserProtocol | None = None

    def __post_init__(self) -> None:
        if self.protocol is not None and not isinstance(self.protocol, UserProtocol):
            raise TypeError(f"a user's protocol is a UserProtocol or None (the domain's), got {self.protocol!r}")
        if self.instructions is not None and "{scenario}" not in self.instructions:
            raise ValueError("UserSimulator.instructions must hold '{scenario}', where the task's scenario goes")
        if self.sampling is not None and self.sampling.max_new_tokens < 0:
            raise ValueError(f"a user's max_new_tokens is positive, or {NO_BUDGET} for no budget of its own")
        if not isinstance(self.model, Policy) and not callable(getattr(self.model, "complete", None)):
            raise TypeError(f"a UserSimulator's model is a Policy or a chat backend, got {type(self.model).__name__}")
        if self.trained and not isinstance(self.model, Policy):
            raise ValueError("a trained user (user='rehearse') is played by the policy itself, not an endpoint")

    def for_protocol(self, protocol: UserProtocol) -> UserSimulator:
        """This user, playing under ``protocol`` where it names none itself."""
        return self if self.protocol is not None else replace(self, protocol=protocol)

    @property
    def reply_sampling(self) -> SamplingParams:
        """How its turns are sampled: its own ``sampling``, else its protocol's."""
        if self.sampling is not None:
            return self.sampling
        return (self.protocol or ENVACE_PROTOCOL).sampling

    def system_template(self, tools: bool = False) -> str:
        """Its system prompt with ``{scenario}`` to fill: its own ``instructions``, else its protocol's (for a user
        with ``tools`` of its own, the protocol's prompt for such users)."""
        if self.instructions is not None:
            return self.instructions
        return (self.protocol or ENVACE_PROTOCOL).instructions(tools)

    @property
    def in_process(self) -> bool:
        return isinstance(self.model, Policy)

    def writes_opening(self, task: Task) -> bool:
        """Whether this user writes the conversation's first message: where the task carries a scenario of its own
        (:func:`own_scenario`); otherwise the task's prompt is the user's opening message, already written."""
        return own_scenario(task) is not None

    def messages(
        self, task: Task, conversation: Sequence[Mapping[str, Any]], tools: bool = False
    ) -> list[dict[str, Any]]:
        """The conversation as the user sees it: the scenario, the agent's greeting, then its own turns as the
        assistant's and the agent's text turns as the user's (the agent's calls, their results and its system prompt
        left out). A user with ``tools`` of its own also sees its own calls (``tool_calls`` on its turns) and their
        results (``"tool"`` messages)."""
        scenario = self.system_template(tools).replace("{scenario}", task_scenario(task))
        seen: list[dict[str, Any]] = [{"role": "system", "content": scenario}, {"role": "user", "content": OPENING}]
        for message in conversation:
            role, content = message.get("role"), message.get("content")
            if role == "tool" and tools:  # a result of the user's own call
                seen.append({k: message[k] for k in ("role", "tool_call_id", "name", "content") if k in message})
            elif role == "user" and message.get("tool_calls") and tools:  # the user's own calls
                seen.append({"role": "assistant", "content": content or "", "tool_calls": message["tool_calls"]})
            elif isinstance(content, str) and role in ("user", "assistant") and not message.get("tool_calls"):
                seen.append({"role": "assistant" if role == "user" else "user", "content": content})
        if self.in_process:  # special-token strings in the text stay text in the user's own prompt
            chat = ChatFormat.of(self.model.tokenizer)  # type: ignore[union-attr]
            return [{**m, "content": chat.neutralize(clean_text(m["content"]))} for m in seen]
        return [_wire({**m, "content": clean_text(m["content"])}) for m in seen]

    def prompt_ids(
        self, task: Task, conversation: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> tuple[int, ...]:
        chat = ChatFormat.of(self.model.tokenizer)  # type: ignore[union-attr]
        rendered = chat.render(self.messages(task, conversation, bool(tools)), list(tools) or None)
        return tuple(chat.encode(rendered))

    # -- the user's turn ------------------------------------------------------------------------------
    def respond(self, requests: Sequence[UserRequest], rng: np.random.Generator) -> list[UserReply]:
        """One reply per request: a policy generates them in one batch (seeded from ``rng``), an endpoint answers
        them concurrently."""
        if not requests:
            return []
        if not self.in_process:
            return self._respond_by_endpoint(requests)
        policy: Policy = self.model  # type: ignore[assignment]
        sampling = self.reply_sampling
        prompts = [self.prompt_ids(r.task, r.conversation, r.tools) for r in requests]
        budget = sampling.max_new_tokens
        reserve = 1 if budget == NO_BUDGET else budget  # the least room a reply needs
        out: list[UserReply | None] = [
            None
            if len(p) + reserve <= policy.max_context
            else UserReply(
                error=f"the user's prompt ({len(p)} tokens) and reply do not fit its "
                f"model's context ({policy.max_context})"
            )  # fmt: skip
            for p in prompts
        ]
        todo = [i for i, reply in enumerate(out) if reply is None]
        if todo:
            if budget == NO_BUDGET:  # a batch shares one bound: what the context leaves after its longest prompt
                sampling = replace(sampling, max_new_tokens=policy.max_context - max(len(prompts[i]) for i in todo))
            params = sampling if sampling.seed is not None else sampling.with_seed(int(rng.integers(2**31)))
            for i, gen in zip(todo, policy.generate([list(prompts[i]) for i in todo], params), strict=True):
                out[i] = self.read(gen, requests[i].tools)
        return out  # type: ignore[return-value]

    def _respond_by_endpoint(self, requests: Sequence[UserRequest]) -> list[UserReply]:
        """Text replies by ``complete``; where the user has tools, replies with calls by the backend's ``reply``
        (:meth:`~envace_gym.endpoint.ChatEndpoint.reply`), all requests that share tools in one call."""
        backend: Any = self.model
        out: list[UserReply | None] = [None] * len(requests)
        by_tools: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            by_tools.setdefault(repr(request.tools), []).append(i)
        for indices in by_tools.values():
            tools = requests[indices[0]].tools
            prompts = [self.messages(requests[i].task, requests[i].conversation, bool(tools)) for i in indices]
            if not tools:
                replies = [self.read_text(text) for text in backend.complete(prompts)]
            elif callable(getattr(backend, "reply", None)):
                replies = [self.read_chat(r) for r in backend.reply(prompts, [dict(t) for t in tools])]
            else:
                raise DomainError(
                    f"this task's user has tools of its own, and the user's backend ({type(backend).__name__}) offers "
                    "none: give it a reply(prompts, tools) method (ChatEndpoint has one) or use an in-process user"
                )
            for i, reply in zip(indices, replies, strict=True):
                out[i] = reply
        return out  # type: ignore[return-value]

    def openings(self, tasks: Sequence[Task], rng: np.random.Generator) -> list[UserReply | None]:
        """The first message of each task's conversation where this user writes it (:meth:`writes_opening`), in
        one call; ``None`` where the task's own prompt opens it."""
        writes = [i for i, task in enumerate(tasks) if self.writes_opening(task)]
        out: list[UserReply | None] = [None] * len(tasks)
        for i, reply in zip(writes, self.respond([UserRequest(self, tasks[i], ()) for i in writes], rng), strict=True):
            out[i] = reply
        return out

    def read(self, generation: Generation, tools: Sequence[Mapping[str, Any]] = ()) -> UserReply:
        """The reply in a policy's ``generation`` (calls of its own ``tools``, written in its model's tool-call
        format), a stop marker, or why it cannot be used."""
        if generation.finish_reason == "length":
            budget = self.reply_sampling.max_new_tokens
            why = ("the user's reply filled its model's context" if budget == NO_BUDGET
                   else f"the user's reply ran past its {budget}-token budget")  # fmt: skip
            return UserReply(error=why, generation=generation)
        chat = ChatFormat.of(self.model.tokenizer)  # type: ignore[union-attr]
        body = list(generation.completion_ids)
        if body and body[-1] in chat.stop_ids:
            body = body[:-1]
        if tools:
            form = tool_call_format(self.model.tokenizer, None, chat.generation_prompt, chat.end_texts)  # type: ignore[union-attr]
            text = chat.act_view(generation.completion_ids, form.act_tokens) if form.act_tokens else generation.text
            parsed = form.parse(text)
            if parsed.error is not None:
                return UserReply(error=f"the user's tool call cannot be read: {parsed.error.message}",
                                 generation=generation)  # fmt: skip
            if parsed.calls:
                return UserReply(text=parsed.content.strip(), generation=generation, calls=tuple(parsed.calls))
        if any(i in chat.special_ids for i in body):
            return UserReply(error="the user's reply holds special tokens", generation=generation)
        reply = self.read_text(generation.text)
        return UserReply(reply.text, reply.stop, reply.error, generation)

    def read_chat(self, reply: Any) -> UserReply:
        """The reply in an endpoint's :class:`~envace_gym.endpoint.ChatReply` (``None``: the request failed): calls
        of the user's own tools, else as :meth:`read_text`."""
        if reply is None or not reply.tool_calls:
            return self.read_text(None if reply is None else reply.content)
        calls = []
        for call_id, name, arguments in reply.tool_calls:
            if isinstance(arguments, str):
                try:
                    arguments = strict_loads(arguments) if arguments.strip() else {}
                except (ValueError, RecursionError):
                    arguments = None
            if not isinstance(arguments, Mapping):
                return UserReply(error=f"the user's call of {name!r} has arguments that are not a JSON object")
            calls.append(ToolCall(name, dict(arguments), id=call_id))
        return UserReply(text=clean_text(reply.content).strip(), calls=tuple(calls))

    def read_text(self, text: str | None) -> UserReply:
        """The reply in ``text`` (an endpoint's; ``None``: the request failed), a stop marker, or why it cannot
        be used."""
        if text is None:
            return UserReply(error="the user's endpoint gave no reply (a timeout, a transport error, a malformed "
                                   "answer or one cut at max_tokens; see the log)")  # fmt: skip
        text = clean_text(text).strip()
        for marker in (self.protocol or ENVACE_PROTOCOL).stop_markers:
            if marker in text:
                return UserReply(stop=marker)
        if not text:
            return UserReply(error="the user's reply is empty")
        return UserReply(text=text)


def check_user(
    user: Any, user_model: str | None = None, temperature: float | None = None, max_tokens: int | None = None
) -> None:
    """Refuse a ``user=`` setting that is none of ``"scripted"`` (or ``None``), ``"llm"``, ``"rehearse"``, an
    endpoint URL (with ``user_model``, its model's name), a :class:`~envace_gym.policy.Policy` or a
    :class:`UserSimulator`; and a user ``temperature`` or ``max_tokens`` that would not apply (no simulated user, a
    :class:`UserSimulator` with its own sampling, a temperature for ``"rehearse"``, which samples as the policy
    acts)."""
    if isinstance(user, str) and user.startswith(("http://", "https://")):
        if not user_model:
            raise ValueError(f"the user endpoint {user!r} needs its model's name (user_model)")
    elif user_model is not None:
        raise ValueError(f"user_model names the model behind a user endpoint URL; user={user!r} is not one")
    elif not (user is None or user in USERS or isinstance(user, (UserSimulator, Policy))):
        raise ValueError(
            "user must be 'scripted', 'llm' (the policy plays the user), 'rehearse' (the policy plays the user and "
            f"learns to), an OpenAI-compatible endpoint URL, a Policy or a UserSimulator, got {user!r}"
        )
    if temperature is None and max_tokens is None:
        return
    if user is None or user == "scripted":
        raise ValueError("user_temperature and user_max_tokens set a simulated user's sampling; user='scripted' has none")
    if isinstance(user, UserSimulator):
        raise ValueError("a UserSimulator carries its own sampling: set temperature and max_new_tokens there")
    if user == "rehearse" and temperature is not None:
        raise ValueError("a trained user (user='rehearse') samples at the policy's own temperature: drop user_temperature")
    if temperature is not None and temperature < 0:
        raise ValueError(f"user_temperature must be at least 0, got {temperature}")
    if max_tokens is not None and max_tokens < 0:
        raise ValueError(f"user_max_tokens must be positive, or {NO_BUDGET} for no budget but the context")


def make_user(
    user: Any,
    own: Callable[[], Policy],
    user_model: str | None = None,
    act: SamplingParams | None = None,
    *,
    protocol: UserProtocol = ENVACE_PROTOCOL,
    temperature: float | None = None,
    max_tokens: int | None = None,
) -> UserSimulator | None:
    """The simulated user ``user=`` asks for (``None`` for the scripted one); ``own()`` gives the policy for
    ``"llm"`` and ``"rehearse"``; ``user_model`` names the model of an endpoint URL (a :class:`ChatEndpoint`: its
    key, if it needs one, from ``ENVACE_API_KEY``). ``protocol`` (the domain's, ``Domain.user_protocol``) sets the
    user's defaults; ``temperature`` and ``max_tokens`` (:data:`NO_BUDGET`: none but the context) replace its
    sampling's. ``act`` is the Act role's sampling: a trained user (``"rehearse"``) samples at its temperature,
    top-p and top-k, since the trainers recompute every trained row's log-probs under the rollout's settings; a
    trained :class:`UserSimulator` that samples otherwise is refused, and so is a ``temperature`` for it. A given
    :class:`UserSimulator` keeps its own sampling (``temperature`` or ``max_tokens`` with it is refused) and its own
    protocol, where it names one.
    """
    check_user(user, user_model, temperature, max_tokens)
    if user is None or user == "scripted":
        return None
    if isinstance(user, UserSimulator):
        user = user.for_protocol(protocol)
        if user.trained and act is not None and not _samples_as(user.reply_sampling, act):
            raise ValueError(
                f"a trained user samples as the policy acts (temperature {act.temperature}, top_p {act.top_p}, top_k "
                f"{act.top_k}): the trainer recomputes its rows' log-probs under those; its sampling is {user.reply_sampling}"
            )
        return user
    sampling = protocol.sampling
    if user == "rehearse" and act is not None:
        sampling = replace(sampling, temperature=act.temperature, top_p=act.top_p, top_k=act.top_k)
    if temperature is not None:
        sampling = replace(sampling, temperature=temperature)
    if max_tokens is not None:
        sampling = replace(sampling, max_new_tokens=max_tokens)
    if user in ("llm", "rehearse"):
        return UserSimulator(own(), sampling, trained=user == "rehearse", protocol=protocol)
    if isinstance(user, str):
        endpoint = ChatEndpoint(user, user_model, temperature=sampling.temperature, top_p=sampling.top_p,  # type: ignore[arg-type]
                                max_tokens=sampling.max_new_tokens or None, timeout=USER_ENDPOINT_TIMEOUT)  # fmt: skip
        return UserSimulator(endpoint, sampling, protocol=protocol)
    return UserSimulator(user, sampling, protocol=protocol)


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """A message of the user's view as an OpenAI endpoint takes it: a call's arguments as a JSON text."""
    if not message.get("tool_calls"):
        return message
    calls = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
             for c in message["tool_calls"]]  # fmt: skip
    return {**message, "tool_calls": calls}


def _samples_as(sampling: SamplingParams, act: SamplingParams) -> bool:
    return (sampling.temperature, sampling.top_p, sampling.top_k) == (act.temperature, act.top_p, act.top_k)


__all__ = [
    "USERS",
    "UserReply",
    "UserRequest",
    "UserSimulator",
    "check_user",
    "make_user",
    "own_scenario",
    "task_scenario",
]
