"""Driving episodes: :class:`EpisodeDriver` runs episodes against a policy, many episodes per ``generate`` call.

Every entry point that plays episodes goes through it: the single env, the vector env, the rollout collector,
the planner's imagined episodes, the SFT reference replay (a driver whose policy refuses to generate,
:class:`NoGeneration`) and the benchmarks. Three levels, each built on the one below:

* :meth:`EpisodeDriver.drive` answers the requests of several episodes' turns (:meth:`Episode.play_turn`
  coroutines) until each returns: rehearsals by the policy (or a frozen simulator), simulated users' turns by
  their simulators, one batch per participant and sampling setting per round;
* :meth:`EpisodeDriver.play` steps every episode with its given move (:meth:`EpisodeDriver.act` writes them);
* :meth:`EpisodeDriver.run` is the episode loop itself: rounds until every episode has ended.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import DomainError
from ..policy.protocol import Generation, Policy, SamplingParams
from .episode import Answer, Episode, Request, TurnCoroutine
from .types import GenerationRequest, StepOutcome
from .users import UserRequest, UserSimulator

# Writes the Act turns of ``episodes`` instead of one batched policy call (e.g. a RehearsalPlanner):
# ``actor(episodes, rng, session, keys)`` returns one generation per episode.
Actor = Callable[[Sequence[Episode], np.random.Generator, Any, Sequence[Hashable] | None], list[Generation]]

# An Act turn to play: its text, or the generation that wrote it (its ids and log-probs are kept).
Move = str | Generation


class EpisodeDriver:
    """The one component that runs episodes against a policy: it writes their Act turns, steps them in
    lockstep, and answers every generation they ask for, batched.

    Args:
        policy: Answers the generations (Act turns and rehearsals: the same weights).
        rng: Seeds every batch whose sampling parameters carry no seed, one draw per ``generate`` call, in
            call order (so a seeded caller gets the same numbers whatever drives it).
        session: A KV-reusing generation session (:func:`open_session`), or ``None``.
        simulator: Answers the episodes' own requests (rehearsals) instead of ``policy``: a frozen simulator,
            as in the paper's ablation where only the Act role trains; ``None``: the policy rehearses.
    """

    def __init__(
        self, policy: Policy, rng: np.random.Generator, session: Any = None, simulator: Policy | None = None
    ) -> None:
        self.policy, self.rng, self.session, self.simulator = policy, rng, session, simulator

    @classmethod
    def without_policy(cls, message: str) -> EpisodeDriver:
        """A driver for replays that must never generate: a generation asked raises ``DomainError(message)``."""
        return cls(NoGeneration(message), np.random.default_rng(0))  # type: ignore[arg-type]

    # -- generation -----------------------------------------------------------------------------------
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, keys: Sequence[Hashable] | None = None
    ) -> list[Generation]:
        """One batched generation (see :func:`generate_batched`); ``keys`` name the conversations the prompts
        continue, for KV reuse."""
        return generate_batched(self.policy, prompts, params, self.rng, self.session, keys)

    def fulfil(self, requests: Sequence[Request]) -> list[Answer]:
        """Every request answered: a simulated user's turns by its simulator (one call per simulator), the
        rest generated one batch per sampling setting, by the simulator if there is one (without the policy's KV
        session: its caches hold the policy's activations), else by the policy."""
        out: list[Answer | None] = [None] * len(requests)
        generations = [i for i, r in enumerate(requests) if isinstance(r, GenerationRequest)]
        by_user: dict[int, tuple[UserSimulator, list[int]]] = {}
        for i, request in enumerate(requests):
            if isinstance(request, UserRequest):
                by_user.setdefault(id(request.user), (request.user, []))[1].append(i)
        for user, indices in by_user.values():
            for i, reply in zip(indices, user.respond([requests[i] for i in indices], self.rng), strict=True):  # type: ignore[misc]
                out[i] = reply
        if generations:
            mine = [requests[i] for i in generations]
            if self.simulator is not None:
                gens = _generate_all(self.simulator, mine, self.rng)  # type: ignore[arg-type]
            else:
                gens = _generate_all(self.policy, mine, self.rng, self.session)  # type: ignore[arg-type]
            for i, gen in zip(generations, gens, strict=True):
                out[i] = gen
        return out  # type: ignore[return-value]

    # -- playing --------------------------------------------------------------------------------------
    def act(self, episodes: Sequence[Episode], params: SamplingParams, actor: Actor | None = None) -> list[Generation]:
        """The next Act turn of each episode, in one batched call with ``params``, or written by ``actor``.
        The prompts are keyed by the episodes' keys (KV reuse) when every episode has one."""
        keys = [e.key for e in episodes]
        keyed = keys if all(k is not None for k in keys) else None
        if actor is not None:
            return list(actor(episodes, self.rng, self.session, keyed))
        return self.generate([e.prompt_ids for e in episodes], params, keyed)

    def drive(self, steps: Sequence[TurnCoroutine], on_done: Callable[[int], None] | None = None) -> list[StepOutcome]:
        """Run several episodes' steps together: at each round, the requests of every step still waiting are
        answered together (:meth:`fulfil`), then each step gets its answers back. ``on_done(i)`` is called as step
        ``i`` finishes (progress)."""
        outcomes: list[Any] = [None] * len(steps)
        waiting: dict[int, list[Request]] = {}
        for i, step in enumerate(steps):
            _advance(i, step, None, waiting, outcomes, on_done)
        while waiting:
            order = list(waiting)
            gens = self.fulfil([request for i in order for request in waiting[i]])
            waiting_now, start = dict(waiting), 0
            waiting.clear()
            for i in order:
                n = len(waiting_now[i])
                _advance(i, steps[i], gens[start : start + n], waiting, outcomes, on_done)
                start += n
        return outcomes

    def play(
        self, episodes: Sequence[Episode], moves: Sequence[Move], on_done: Callable[[int], None] | None = None
    ) -> list[StepOutcome]:
        """Step each episode with its move (an Act text, or the generation that wrote it), in lockstep."""
        if len(moves) != len(episodes):
            raise ValueError(f"expected one move per episode ({len(episodes)}), got {len(moves)}")
        steps = [
            e.play_turn(m.text, m) if isinstance(m, Generation) else e.play_turn(m)
            for e, m in zip(episodes, moves, strict=True)
        ]
        return self.drive(steps, on_done)

    def run(
        self,
        episodes: Sequence[Episode],
        act: SamplingParams | Callable[[Sequence[Episode]], Sequence[Move]],
        *,
        actor: Actor | None = None,
        on_round: Callable[[Sequence[int], Sequence[Move]], None] | None = None,
        on_end: Callable[[int, StepOutcome], None] | None = None,
    ) -> list[StepOutcome]:
        """The episode loop: play ``episodes`` to their end, in rounds, and return each one's last outcome.

        Each round, the Act turns of the episodes still live are written, all at once: generated with ``act`` (a
        :class:`SamplingParams`; or by ``actor``), or given by ``act(episodes)`` (texts or generations: a
        reference replay); then the episodes step together (:meth:`play`), and those that ended leave.
        ``on_round(live, moves)`` sees each round's live indices and moves; ``on_end(i, outcome)`` each end."""
        outcomes: list[StepOutcome | None] = [None] * len(episodes)
        live = [i for i, e in enumerate(episodes) if not e.done]
        while live:
            playing = [episodes[i] for i in live]
            moves = self.act(playing, act, actor) if isinstance(act, SamplingParams) else list(act(playing))
            if on_round is not None:
                on_round(live, moves)
            still = []
            for i, outcome in zip(live, self.play(playing, moves), strict=True):
                if outcome.terminated or outcome.truncated:
                    outcomes[i] = outcome
                    if on_end is not None:
                        on_end(i, outcome)
                else:
                    still.append(i)
            live = still
        return outcomes  # type: ignore[return-value]


class NoGeneration:
    """Stands in for a policy where nothing may be generated (a reference replay): asking raises
    ``DomainError(message)``."""

    def __init__(self, message: str) -> None:
        self.message = message

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        raise DomainError(self.message)


# -- the driver's steps, for callers that hold no driver ------------------------------------------------
def open_session(policy: Policy) -> Any:
    """A KV-reusing generation session when the policy offers one (``policy.session()``), else ``None``."""
    make = getattr(policy, "session", None)
    return make() if callable(make) else None


def generate_batched(
    policy: Policy,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    rng: np.random.Generator,
    session: Any = None,
    keys: Sequence[Hashable] | None = None,
) -> list[Generation]:
    """One batched generation, seeded from ``rng`` unless ``params`` carries a seed. With a ``session`` and
    conversation ``keys``, prompts that continue a known conversation reuse its KV cache."""
    if params.seed is None:
        params = params.with_seed(int(rng.integers(2**31)))
    if session is not None and keys is not None:
        return session.generate(list(keys), [list(p) for p in prompts], params)
    fresh = getattr(session, "generate_fresh", None)
    if fresh is not None:  # fresh prompts: the session still shares their common prefix
        return fresh([list(p) for p in prompts], params)
    return policy.generate([list(p) for p in prompts], params)


def _generate_all(
    policy: Policy, requests: Sequence[GenerationRequest], rng: np.random.Generator, session: Any = None
) -> list[Generation]:
    """Generate every request, batching those that share sampling parameters into one call each."""
    out: list[Generation | None] = [None] * len(requests)
    groups: dict[tuple[SamplingParams, bool], list[int]] = {}
    for i, request in enumerate(requests):
        groups.setdefault((replace(request.params, seed=None), request.key is not None), []).append(i)
    for (params, keyed), indices in groups.items():
        prompts = [requests[i].prompt_ids for i in indices]
        keys = [requests[i].key for i in indices] if keyed and session is not None else None
        for i, gen in zip(indices, generate_batched(policy, prompts, params, rng, session, keys), strict=True):
            out[i] = gen
    return out  # type: ignore[return-value]


def _advance(
    i: int, step: TurnCoroutine, sent: Any, waiting: dict, outcomes: list, on_done: Callable[[int], None] | None
) -> None:
    try:
        waiting[i] = step.send(sent) if sent is not None else next(step)
    except StopIteration as stop:
        outcomes[i] = stop.value
        if on_done is not None:
            on_done(i)
