"""τ²-Bench's user protocol (``Tau2Domain.user_protocol``): τ²'s own user, its bounds and its scoring.

The user's system prompt is τ²'s simulation guidelines (its variant for users with tools where the user has some),
read from the installed τ² package at run time (never copied here), with the scenario in ``<scenario>`` tags; the
user replies greedily (temperature 0) with no budget of its own (what its model's context leaves); the agent's
greeting opens the agent's history too. The episode answers a tool error and goes on (``on_invalid="feedback"``;
``"terminate"`` is refused), has no turn bound of its own, and ends at τ²'s bounds (``max_messages``: 200 messages,
counted as τ²'s orchestrator counts its steps; ``max_errors``: 10) with reward 0; any end but the user's stop marker
earns 0, and a user who could not write the first message fails the run (``"user_error"``), as τ² counts them.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import replace
from pathlib import Path

from envace_gym.domains.user_protocol import NO_BUDGET, USER_SAMPLING, EpisodeRules, UserProtocol
from envace_gym.errors import DomainError

TAU2_MAX_STEPS = 200  # τ²-Bench's bounds (its DEFAULT_MAX_STEPS, DEFAULT_MAX_ERRORS)
TAU2_MAX_ERRORS = 10
# inside the τ² package: its user's guidelines, and their variant for a user with tools of its own
TAU2_GUIDELINES = "data/tau2/user_simulator/simulation_guidelines.md"
TAU2_GUIDELINES_TOOLS = "data/tau2/user_simulator/simulation_guidelines_tools.md"
# τ²'s: greedy, no reply budget (built from the core's sampling: a domain names no stage past domains)
TAU2_USER_SAMPLING = replace(USER_SAMPLING, max_new_tokens=NO_BUDGET, temperature=0.0)


@functools.cache
def tau2_instructions(tools: bool = False) -> str:
    """τ²-Bench's user system prompt with ``{scenario}`` where the scenario goes: its simulation guidelines file
    (``tools``: the variant for a user with tools of its own), read from the installed τ² package (never copied
    here), then the scenario in ``<scenario>`` tags, laid out as τ²'s ``UserSimulator.system_prompt`` lays it out."""
    spec = importlib.util.find_spec("tau2")
    if spec is None or not spec.submodule_search_locations:
        raise DomainError("the τ² protocol reads τ²-Bench's user guidelines from its package: run `make benchmarks`")
    path = Path(next(iter(spec.submodule_search_locations))) / (TAU2_GUIDELINES_TOOLS if tools else TAU2_GUIDELINES)
    try:
        guidelines = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DomainError(
            f"τ²-Bench's user guidelines cannot be read ({exc}); reinstall it: `make benchmarks`"
        ) from exc
    # τ²'s layout: f"{guidelines}\n\n<scenario>\n{scenario}\n</scenario>".strip()
    return f"{guidelines.lstrip()}\n\n<scenario>\n{{scenario}}\n</scenario>"


class Tau2Protocol(UserProtocol):
    """τ²-Bench's protocol (the module says what it is)."""

    name = "tau2"
    sampling = TAU2_USER_SAMPLING
    greets = True
    failed_opening_fails = True
    scores_cut_runs = False

    def instructions(self, tools: bool = False) -> str:
        return tau2_instructions(tools)

    def rules(self, asked: EpisodeRules, domain_max_turns: int) -> EpisodeRules:
        """τ²'s: a tool error is answered and the episode goes on, its two bounds, and no turn bound of its own."""
        on_invalid = asked.on_invalid or "feedback"
        if on_invalid != "feedback":
            raise ValueError(
                "under the τ² protocol a tool error is answered and the episode goes on (its max_errors ends it): "
                "on_invalid='terminate' is not τ²'s; use on_invalid='feedback' (or None), or a user with the envace "
                "protocol (UserSimulator(protocol=ENVACE_PROTOCOL))"
            )
        return EpisodeRules(
            on_invalid, asked.max_turns, asked.max_user_turns, asked.max_messages or TAU2_MAX_STEPS,
            asked.max_errors or TAU2_MAX_ERRORS,
        )  # fmt: skip


TAU2_PROTOCOL = Tau2Protocol()

__all__ = [
    "TAU2_GUIDELINES",
    "TAU2_GUIDELINES_TOOLS",
    "TAU2_MAX_ERRORS",
    "TAU2_MAX_STEPS",
    "TAU2_PROTOCOL",
    "TAU2_USER_SAMPLING",
    "Tau2Protocol",
    "tau2_instructions",
]
