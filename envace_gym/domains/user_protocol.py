"""The rules a simulated user plays a domain's episodes under: a :class:`UserProtocol`.

A domain names its protocol (``Domain.user_protocol``); a benchmark whose users follow rules of their own (its user
prompt, its bounds, how it scores a run cut short) subclasses :class:`UserProtocol` in its own folder under
``envs/``, and the episode and the users (:mod:`envace_gym.episode`) ask it, never naming a benchmark. The base
class is this project's own, looser protocol (``"envace"``): a short instruction, sampled replies, the domain's Act
turn bound and :data:`MAX_USER_TURNS`, a malformed call ending the episode, a cut run scored.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy.protocol import SamplingParams

MAX_USER_TURNS = 30  # the default of every entry point that plays episodes (the "envace" protocol's)
OPENING = "Hi! How can I help you today?"  # the agent's greeting the user's view opens with
STOP_MARKERS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")  # a user's reply that ends the conversation
INSTRUCTIONS = """You are playing a user who talks to a customer-service assistant. Stay in character: you are the \
user, not the assistant. Write one short message per turn, as a person would, and reveal what you know only when \
the assistant asks for it. Never invent facts the scenario does not give.

When your request has been done, or the assistant says it cannot be done, reply with only ###STOP###. If you are \
transferred to a human agent, reply with only ###TRANSFER###. If the assistant asks something the scenario does \
not answer, reply with only ###OUT-OF-SCOPE###.

Your scenario:
{scenario}"""
NO_BUDGET = 0  # a user's max_new_tokens that means "no budget of its own": what its model's context leaves
USER_SAMPLING = SamplingParams(max_new_tokens=128, temperature=0.7)  # a simulated user's turns under "envace"


@dataclass(frozen=True)
class EpisodeRules:
    """An episode's error rule and bounds: ``on_invalid`` (``"terminate"`` or ``"feedback"``), the most Act turns,
    user turns, messages and tool errors (``None``: no bound). Asked for by the episode's config (``None``: the
    protocol's), settled by :meth:`UserProtocol.rules`."""

    on_invalid: str | None = None
    max_turns: int | None = None
    max_user_turns: int | None = None
    max_messages: int | None = None
    max_errors: int | None = None


class UserProtocol:
    """The "envace" protocol; a benchmark's protocol overrides what differs. Every attribute is read by the episode
    (:class:`~envace_gym.episode.Episode`) or the simulated user (:class:`~envace_gym.episode.users.UserSimulator`).

    Attributes:
        name: The protocol's name (logs, ``repr``).
        sampling: How a simulated user samples its turns where it sets nothing itself.
        stop_markers: A reply holding one of these ends the conversation (:data:`STOP_MARKERS`: the request done or
            impossible, handed to a human, out of the scenario's scope).
        greets: The agent's greeting (:data:`OPENING`), which the user answered, opens the agent's history too
            (where the user writes the first message).
        failed_opening_fails: A first message the user could not write ends the run at the first step as the user's
            failure (``"user_error"``); otherwise the task's own prompt stands in for it and the episode goes on.
        scores_cut_runs: A run cut short (a turn, user-turn or context limit) is scored by the domain; otherwise it
            earns 0, as a benchmark that counts only runs the user ended may score it.
    """

    name: str = "envace"
    sampling: SamplingParams = USER_SAMPLING
    stop_markers: tuple[str, ...] = STOP_MARKERS
    greets: bool = False
    failed_opening_fails: bool = False
    scores_cut_runs: bool = True

    def instructions(self, tools: bool = False) -> str:
        """The user's system prompt with ``{scenario}`` where the task's scenario goes (``tools``: for a user with
        tools of its own)."""
        return INSTRUCTIONS

    def rules(self, asked: EpisodeRules, domain_max_turns: int) -> EpisodeRules:
        """The rules an episode plays by: what ``asked`` sets, else this protocol's defaults (a malformed call
        terminates; the domain's Act-turn bound; :data:`MAX_USER_TURNS`; no message or error bound). Raises
        ``ValueError`` for a rule the protocol cannot play by."""
        return EpisodeRules(
            asked.on_invalid or "terminate",
            asked.max_turns or domain_max_turns,
            asked.max_user_turns if asked.max_user_turns is not None else MAX_USER_TURNS,
            asked.max_messages,
            asked.max_errors,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


ENVACE_PROTOCOL = UserProtocol()  # the default of every domain (Domain.user_protocol)


__all__ = [
    "ENVACE_PROTOCOL",
    "INSTRUCTIONS",
    "MAX_USER_TURNS",
    "NO_BUDGET",
    "OPENING",
    "STOP_MARKERS",
    "USER_SAMPLING",
    "EpisodeRules",
    "UserProtocol",
]
