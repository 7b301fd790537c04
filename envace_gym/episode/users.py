"""Simulated users: an LLM plays the user of a multi-turn task, as τ²-Bench scores agents.

A scripted user replays the task's later user turns whatever the agent says. A :class:`UserSimulator` instead
holds the task's scenario privately and answers each of the agent's text turns, seeing the conversation from
its own side: its own messages as the assistant's, the agent's text turns as the user's, no tool call and no
tool result. It ends the conversation with one of :data:`STOP_MARKERS` (τ²'s protocol): ``###STOP###`` when the
request is done or cannot be done, ``###TRANSFER###`` when it was handed to a human, ``###OUT-OF-SCOPE###`` when
the scenario does not say what to answer.

Its turns enter the agent's conversation as context (never trained as the agent's); its prompts are fresh and
tokenized with the simulator's own tokenizer, so any :class:`~envace_gym.policy.Policy` can play the user: a
second model, the embedded default model, or the policy itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..domains.task import Task
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


def task_scenario(task: Task) -> str:
    """What the user knows and wants: ``task.expected["user_scenario"]`` when the task carries one (τ²-Bench's),
    else the opening request and the later scripted user turns, as what the user may go on to say."""
    given = task.expected.get("user_scenario") if isinstance(task.expected, Mapping) else None
    if isinstance(given, str) and given.strip():
        return given
    lines = [f"Your request, which you have already written: {task.prompt}"]
    if task.user_turns:
        lines.append("What you may go on to say, when it fits what the assistant says:")
        lines += [f"- {turn}" for turn in task.user_turns]
    return "\n".join(lines)


@dataclass(frozen=True)
class UserReply:
    """What the simulator said: ``text`` (a message for the agent), or ``stop`` (a marker that ends the
    conversation), or ``error`` (a reply that cannot be used: the episode is masked)."""

    text: str = ""
    stop: str | None = None
    error: str | None = None


@dataclass
class UserSimulator:
    """An LLM user (τ²-Bench's protocol) for ``RehearsalEnv(user=...)`` and ``collect_rollouts(user=...)``.

    Args:
        policy: Writes the user's turns (its own tokenizer and chat template render its prompts).
        sampling: How its turns are sampled (its ``max_new_tokens`` bounds a turn: a reply cut there is refused).
        instructions: The system prompt; ``{scenario}`` is replaced by :func:`task_scenario`'s text.
    """

    policy: Policy
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=128, temperature=0.7))
    instructions: str = INSTRUCTIONS

    def __post_init__(self) -> None:
        if "{scenario}" not in self.instructions:
            raise ValueError("UserSimulator.instructions must hold '{scenario}', where the task's scenario goes")

    def messages(self, task: Task, conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
        """The conversation as the user sees it: the scenario, then its own turns as the assistant's and the
        agent's text turns as the user's (tool calls, tool results and the agent's system prompt left out)."""
        chat = ChatFormat.of(self.policy.tokenizer)
        seen = [{"role": "system", "content": self.instructions.replace("{scenario}", task_scenario(task))},
                {"role": "user", "content": OPENING}]  # fmt: skip
        for message in conversation:
            role, content = message.get("role"), message.get("content")
            if not isinstance(content, str) or role not in ("user", "assistant") or message.get("tool_calls"):
                continue
            seen.append({"role": "assistant" if role == "user" else "user", "content": content})
        return [{**m, "content": chat.neutralize(clean_text(m["content"]))} for m in seen]

    def prompt_ids(self, task: Task, conversation: Sequence[Mapping[str, Any]]) -> tuple[int, ...]:
        chat = ChatFormat.of(self.policy.tokenizer)
        return tuple(chat.encode(chat.render(self.messages(task, conversation))))

    def read(self, generation: Generation) -> UserReply:
        """The reply in ``generation``, a stop marker, or why it cannot be used."""
        chat = ChatFormat.of(self.policy.tokenizer)
        if generation.finish_reason == "length":
            return UserReply(error=f"the user's reply ran past its {self.sampling.max_new_tokens}-token budget")
        body = list(generation.completion_ids)
        if body and body[-1] in chat.stop_ids:
            body = body[:-1]
        special = set(self.policy.tokenizer.all_special_ids)
        if any(i in special for i in body):
            return UserReply(error="the user's reply holds special tokens")
        text = clean_text(generation.text).strip()
        for marker in STOP_MARKERS:
            if marker in text:
                return UserReply(stop=marker)
        if not text:
            return UserReply(error="the user's reply is empty")
        return UserReply(text=text)


USERS = ("scripted", "policy")


def check_user(user: Any) -> None:
    """Refuse a ``user=`` setting that is none of ``"scripted"`` (or ``None``), ``"policy"``, a
    :class:`~envace_gym.policy.Policy` or a :class:`UserSimulator`."""
    if user is None or user in USERS or isinstance(user, (UserSimulator, Policy)):
        return
    raise ValueError(f"user must be 'scripted', 'policy' (the policy plays the user too), a Policy or a "
                     f"UserSimulator, got {user!r}")  # fmt: skip


def make_user(user: Any, own: Callable[[], Policy]) -> UserSimulator | None:
    """The simulated user ``user=`` asks for (``None`` for the scripted one); ``own()`` gives the policy for
    ``"policy"``."""
    check_user(user)
    if user is None or user == "scripted":
        return None
    if isinstance(user, UserSimulator):
        return user
    return UserSimulator(own() if user == "policy" else user)


__all__ = ["OPENING", "STOP_MARKERS", "USERS", "UserReply", "UserSimulator", "check_user", "make_user", "task_scenario"]
