"""Driving episodes: :class:`EpisodeDriver` runs episodes against a policy, many episodes per ``generate`` call.

Every entry point that plays episodes goes through it: the single env, the vector env, the rollout collector,
the planner's imagined episodes, the SFT reference replay (a driver whose policy refuses to generate,
:class:`NoGeneration`) and the benchmarks. The module-level functions are the driver's steps, kept for
callers that hold no driver.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import DomainError
from ..policy.protocol import Generation, Policy, SamplingParams
from .episode import Episode
from .types import GenerationRequest, StepOutcome

StepCoroutine = Generator[list[GenerationRequest], list[Generation], StepOutcome]

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

    def fulfil(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Every request generated, one batch per sampling setting (see :func:`fulfil`): by the policy a request
        names (a simulated user's), else by the simulator if there is one (without the policy's KV session: its
        caches hold the policy's activations), else by the policy."""
        out: list[Generation | None] = [None] * len(requests)
        by_generator: dict[int, tuple[Policy | None, list[int]]] = {}
        for i, request in enumerate(requests):
            by_generator.setdefault(id(request.generator), (request.generator, []))[1].append(i)
        for generator, indices in by_generator.values():
            mine = [requests[i] for i in indices]
            if generator is not None:
                gens = fulfil(generator, mine, self.rng)
            elif self.simulator is not None:
                gens = fulfil(self.simulator, mine, self.rng)
            else:
                gens = fulfil(self.policy, mine, self.rng, self.session)
            for i, gen in zip(indices, gens, strict=True):
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

    def step(self, steps: Sequence[StepCoroutine], on_done: Callable[[int], None] | None = None) -> list[StepOutcome]:
        """Run several episodes' steps together: at each round, the requests of every step still waiting are
        generated in one batch per sampling setting, then each step gets its generations back. ``on_done(i)``
        is called as step ``i`` finishes (progress)."""
        outcomes: list[Any] = [None] * len(steps)
        waiting: dict[int, list[GenerationRequest]] = {}
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
            e.step(m.text, m) if isinstance(m, Generation) else e.step(m) for e, m in zip(episodes, moves, strict=True)
        ]
        return self.step(steps, on_done)

    def play_turn(
        self,
        episodes: Sequence[Episode],
        params: SamplingParams,
        actor: Actor | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> list[StepOutcome]:
        """One round: the Act turns of ``episodes`` (:meth:`act`), then their steps (:meth:`play`)."""
        return self.play(episodes, self.act(episodes, params, actor), on_done)


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


def fulfil(
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


def run_lockstep(
    steps: Sequence[StepCoroutine],
    policy: Policy,
    rng: np.random.Generator,
    session: Any = None,
    on_done: Callable[[int], None] | None = None,
) -> list[StepOutcome]:
    """:meth:`EpisodeDriver.step` without a driver: several episodes' steps run together, their requests
    generated in one batch per sampling setting per round."""
    return EpisodeDriver(policy, rng, session).step(steps, on_done)


def _advance(
    i: int, step: StepCoroutine, sent: Any, waiting: dict, outcomes: list, on_done: Callable[[int], None] | None
) -> None:
    try:
        waiting[i] = step.send(sent) if sent is not None else next(step)
    except StopIteration as stop:
        outcomes[i] = stop.value
        if on_done is not None:
            on_done(i)
