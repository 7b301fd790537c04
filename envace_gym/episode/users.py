"""Simulated users: an LLM plays the user of a multi-turn task, as τ²-Bench scores agents.

A scripted user replays the task's later user turns whatever the agent says. A :class:`UserSimulator` instead
holds the task's scenario privately and answers each of the agent's text turns, seeing the conversation from
its own side: its own messages as the assistant's, the agent's answers as the user's (their content only: no
reasoning, no tool call, no malformed call's text, no tool result and no error), as τ² shows its user. It ends
the conversation with one of :data:`STOP_MARKERS` (τ²'s protocol): ``###STOP###`` when the request is done or
cannot be done, ``###TRANSFER###`` when it was handed to a human, ``###OUT-OF-SCOPE###`` when
the scenario does not say what to answer. Where the task carries a scenario of its own (τ²-Bench's), the user
also writes the conversation's first message, after the agent's greeting (:data:`OPENING`), as τ² does.

The user is a participant, like the policy: an episode asks for its turn with a :class:`UserRequest`, the
:class:`~envace_gym.episode.driver.EpisodeDriver` gathers the requests of a round and asks each simulator once
(:meth:`UserSimulator.respond`), and the episode gets a :class:`UserReply` back. Its turns enter the agent's
conversation as context, never trained as the agent's. Its model is any :class:`~envace_gym.policy.Policy` (a
second model, the embedded default model, or the policy itself, whose own tokenizer renders the user's prompts)
or a chat endpoint (:class:`~envace_gym.endpoint.ChatEndpoint`). With ``trained=True`` (``user="rehearse"``) the
policy rehearses its users: each of their generations is also a training row of role ``"user"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..domains.task import Task
from ..endpoint import ChatBackend, ChatEndpoint
from ..policy.protocol import Generation, Policy, SamplingParams
from ..text import clean_text
from .chat import ChatFormat

STOP_MARKERS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
OPENING = "Hi! How can I help you today?"  # the agent's greeting the user's view opens with, as in τ²-Bench
INSTRUCTIONS = """You are playing a user who talks to a customer-service assistant. Stay in character: you are the \
user, not the assistant. Write one short message per turn, as a person would, and reveal what you know only when \
the assistant asks for it. Never invent facts the scenario does not give.

When your request has been done, or the assistant says it cannot be done, reply with only ###STOP###. If you are \
transferred to a human agent, reply with only ###TRANSFER###. If the assistant asks something the scenario does \
not answer, reply with only ###OUT-OF-SCOPE###.

Your scenario:
{scenario}"""
USERS = ("scripted", "llm", "rehearse")  # the named settings of ``user=``; a URL is an endpoint
USER_SAMPLING = SamplingParams(max_new_tokens=128, temperature=0.7)  # a simulated user's turns, by default


def own_scenario(task: Task) -> str | None:
    """The scenario the task carries for a simulated user (``task.expected["user_scenario"]``, τ²-Bench's), if any."""
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
    """What the simulator said: ``text`` (a message for the agent), or ``stop`` (a marker that ends the
    conversation), or ``error`` (a reply that cannot be used: the episode is masked). ``generation`` is what a
    policy-backed user generated (its ids and log-probs: the ``"user"`` row when it is trained)."""

    text: str = ""
    stop: str | None = None
    error: str | None = None
    generation: Generation | None = None


@dataclass(frozen=True)
class UserRequest:
    """An episode asking its simulated user for a turn: the task and the conversation so far as the user may see
    it (the episode's ``user_view``; empty: the user writes the opening)."""

    user: UserSimulator
    task: Task
    conversation: tuple[Mapping[str, Any], ...]


@dataclass(eq=False)
class UserSimulator:
    """An LLM user (τ²-Bench's protocol) for ``RehearsalEnv(user=...)`` and ``collect_rollouts(user=...)``.

    Args:
        model: Writes the user's turns: a :class:`~envace_gym.policy.Policy` (its own tokenizer and chat
            template render the prompts; its turns are token-exact and can be trained) or a chat backend such as
            :class:`~envace_gym.endpoint.ChatEndpoint` (its own sampling settings apply; a request that fails is
            an unusable reply).
        sampling: How a policy samples the user's turns (its ``max_new_tokens`` bounds a turn: a reply cut there
            is refused).
        instructions: The system prompt; ``{scenario}`` is replaced by :func:`task_scenario`'s text.
        trained: The policy rehearses its users: each user generation is a training row of role ``"user"``
            (``user="rehearse"``; ``model`` must be the policy being trained).
    """

    model: Policy | ChatBackend
    sampling: SamplingParams = USER_SAMPLING
    instructions: str = INSTRUCTIONS
    trained: bool = False

    def __post_init__(self) -> None:
        if "{scenario}" not in self.instructions:
            raise ValueError("UserSimulator.instructions must hold '{scenario}', where the task's scenario goes")
        if not isinstance(self.model, Policy) and not callable(getattr(self.model, "complete", None)):
            raise TypeError(f"a UserSimulator's model is a Policy or a chat backend, got {type(self.model).__name__}")
        if self.trained and not isinstance(self.model, Policy):
            raise ValueError("a trained user (user='rehearse') is played by the policy itself, not an endpoint")

    @property
    def in_process(self) -> bool:
        return isinstance(self.model, Policy)

    def writes_opening(self, task: Task) -> bool:
        """Whether this user writes the conversation's first message: where the task carries a scenario of its own
        (τ²-Bench's); otherwise the task's prompt is the user's opening message, already written."""
        return own_scenario(task) is not None

    def messages(self, task: Task, conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
        """The conversation as the user sees it: the scenario, the agent's greeting, then its own turns as the
        assistant's and the agent's text turns as the user's (tool calls, tool results and the agent's system prompt
        left out)."""
        seen = [{"role": "system", "content": self.instructions.replace("{scenario}", task_scenario(task))},
                {"role": "user", "content": OPENING}]  # fmt: skip
        for message in conversation:
            role, content = message.get("role"), message.get("content")
            if not isinstance(content, str) or role not in ("user", "assistant") or message.get("tool_calls"):
                continue
            seen.append({"role": "assistant" if role == "user" else "user", "content": content})
        if self.in_process:  # special-token strings in the text stay text in the user's own prompt
            chat = ChatFormat.of(self.model.tokenizer)  # type: ignore[union-attr]
            return [{**m, "content": chat.neutralize(clean_text(m["content"]))} for m in seen]
        return [{**m, "content": clean_text(m["content"])} for m in seen]

    def prompt_ids(self, task: Task, conversation: Sequence[Mapping[str, Any]]) -> tuple[int, ...]:
        chat = ChatFormat.of(self.model.tokenizer)  # type: ignore[union-attr]
        return tuple(chat.encode(chat.render(self.messages(task, conversation))))

    # -- the user's turn ------------------------------------------------------------------------------
    def respond(self, requests: Sequence[UserRequest], rng: np.random.Generator) -> list[UserReply]:
        """One reply per request: a policy generates them in one batch (seeded from ``rng``), an endpoint answers
        them concurrently."""
        if not requests:
            return []
        if not self.in_process:
            prompts = [self.messages(r.task, r.conversation) for r in requests]
            return [self.read_text(text) for text in self.model.complete(prompts)]  # type: ignore[union-attr]
        policy: Policy = self.model  # type: ignore[assignment]
        prompts = [self.prompt_ids(r.task, r.conversation) for r in requests]
        room = policy.max_context - self.sampling.max_new_tokens
        out: list[UserReply | None] = [
            None
            if len(p) <= room
            else UserReply(
                error=f"the user's prompt ({len(p)} tokens) and reply do not fit its "
                f"model's context ({policy.max_context})"
            )  # fmt: skip
            for p in prompts
        ]
        todo = [i for i, reply in enumerate(out) if reply is None]
        if todo:
            params = (
                self.sampling if self.sampling.seed is not None else self.sampling.with_seed(int(rng.integers(2**31)))
            )
            for i, gen in zip(todo, policy.generate([list(prompts[i]) for i in todo], params), strict=True):
                out[i] = self.read(gen)
        return out  # type: ignore[return-value]

    def openings(self, tasks: Sequence[Task], rng: np.random.Generator) -> list[UserReply | None]:
        """The first message of each task's conversation where this user writes it (:meth:`writes_opening`), in
        one call; ``None`` where the task's own prompt opens it."""
        writes = [i for i, task in enumerate(tasks) if self.writes_opening(task)]
        out: list[UserReply | None] = [None] * len(tasks)
        for i, reply in zip(writes, self.respond([UserRequest(self, tasks[i], ()) for i in writes], rng), strict=True):
            out[i] = reply
        return out

    def read(self, generation: Generation) -> UserReply:
        """The reply in a policy's ``generation``, a stop marker, or why it cannot be used."""
        if generation.finish_reason == "length":
            why = f"the user's reply ran past its {self.sampling.max_new_tokens}-token budget"
            return UserReply(error=why, generation=generation)
        chat = ChatFormat.of(self.model.tokenizer)  # type: ignore[union-attr]
        body = list(generation.completion_ids)
        if body and body[-1] in chat.stop_ids:
            body = body[:-1]
        if any(i in chat.special_ids for i in body):
            return UserReply(error="the user's reply holds special tokens", generation=generation)
        reply = self.read_text(generation.text)
        return UserReply(reply.text, reply.stop, reply.error, generation)

    def read_text(self, text: str | None) -> UserReply:
        """The reply in ``text`` (an endpoint's; ``None``: the request failed), a stop marker, or why it cannot
        be used."""
        if text is None:
            return UserReply(error="the user's endpoint gave no reply (a timeout, a transport error, a malformed "
                                   "answer or one cut at max_tokens; see the log)")  # fmt: skip
        text = clean_text(text).strip()
        for marker in STOP_MARKERS:
            if marker in text:
                return UserReply(stop=marker)
        if not text:
            return UserReply(error="the user's reply is empty")
        return UserReply(text=text)


def check_user(user: Any, user_model: str | None = None) -> None:
    """Refuse a ``user=`` setting that is none of ``"scripted"`` (or ``None``), ``"llm"``, ``"rehearse"``, an
    endpoint URL (with ``user_model``, its model's name), a :class:`~envace_gym.policy.Policy` or a
    :class:`UserSimulator`."""
    if isinstance(user, str) and user.startswith(("http://", "https://")):
        if not user_model:
            raise ValueError(f"the user endpoint {user!r} needs its model's name (user_model)")
        return
    if user_model is not None:
        raise ValueError(f"user_model names the model behind a user endpoint URL; user={user!r} is not one")
    if user is None or user in USERS or isinstance(user, (UserSimulator, Policy)):
        return
    raise ValueError(
        "user must be 'scripted', 'llm' (the policy plays the user), 'rehearse' (the policy plays the user and "
        f"learns to), an OpenAI-compatible endpoint URL, a Policy or a UserSimulator, got {user!r}"
    )


def make_user(
    user: Any, own: Callable[[], Policy], user_model: str | None = None, act: SamplingParams | None = None
) -> UserSimulator | None:
    """The simulated user ``user=`` asks for (``None`` for the scripted one); ``own()`` gives the policy for
    ``"llm"`` and ``"rehearse"``; ``user_model`` names the model of an endpoint URL (a :class:`ChatEndpoint`: its
    key, if it needs one, from ``ENVACE_API_KEY``). ``act`` is the Act role's sampling: a trained user
    (``"rehearse"``) samples at its temperature, top-p and top-k, since the trainers recompute every trained row's
    log-probs under the rollout's settings; a trained :class:`UserSimulator` that samples otherwise is refused."""
    check_user(user, user_model)
    if user is None or user == "scripted":
        return None
    if isinstance(user, UserSimulator):
        if user.trained and act is not None and not _samples_as(user.sampling, act):
            raise ValueError(
                f"a trained user samples as the policy acts (temperature {act.temperature}, top_p {act.top_p}, top_k "
                f"{act.top_k}): the trainer recomputes its rows' log-probs under those; its sampling is {user.sampling}"
            )
        return user
    if user == "llm":
        return UserSimulator(own())
    if user == "rehearse":
        sampling = USER_SAMPLING if act is None else _sampled_as(act)
        return UserSimulator(own(), sampling, trained=True)
    if isinstance(user, str):
        endpoint = ChatEndpoint(user, user_model, temperature=USER_SAMPLING.temperature,  # type: ignore[arg-type]
                                max_tokens=USER_SAMPLING.max_new_tokens)  # fmt: skip
        return UserSimulator(endpoint)
    return UserSimulator(user)


def _sampled_as(act: SamplingParams) -> SamplingParams:
    """A user turn's sampling with the Act role's temperature, top-p and top-k."""
    return replace(USER_SAMPLING, temperature=act.temperature, top_p=act.top_p, top_k=act.top_k)


def _samples_as(sampling: SamplingParams, act: SamplingParams) -> bool:
    return (sampling.temperature, sampling.top_p, sampling.top_k) == (act.temperature, act.top_p, act.top_k)


__all__ = [
    "OPENING",
    "STOP_MARKERS",
    "USERS",
    "UserReply",
    "UserRequest",
    "UserSimulator",
    "check_user",
    "make_user",
    "own_scenario",
    "task_scenario",
]
