"""Driving episodes: answer their generation requests with a policy, many episodes per ``generate`` call."""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..policy.protocol import Generation, Policy, SamplingParams
from .types import GenerationRequest, StepOutcome

StepCoroutine = Generator[list[GenerationRequest], list[Generation], StepOutcome]


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
    """Run several episodes' steps together: at each round, the requests of every step still waiting are
    generated in one batch per sampling setting, then each step gets its generations back. ``on_done(i)`` is
    called as step ``i`` finishes (progress)."""
    outcomes: list[Any] = [None] * len(steps)
    waiting: dict[int, list[GenerationRequest]] = {}
    for i, step in enumerate(steps):
        _advance(i, step, None, waiting, outcomes, on_done)
    while waiting:
        order = list(waiting)
        flat = [request for i in order for request in waiting[i]]
        gens = fulfil(policy, flat, rng, session)
        waiting_now, start = dict(waiting), 0
        waiting.clear()
        for i in order:
            n = len(waiting_now[i])
            _advance(i, steps[i], gens[start : start + n], waiting, outcomes, on_done)
            start += n
    return outcomes


def _advance(
    i: int, step: StepCoroutine, sent: Any, waiting: dict, outcomes: list, on_done: Callable[[int], None] | None
) -> None:
    try:
        waiting[i] = step.send(sent) if sent is not None else next(step)
    except StopIteration as stop:
        outcomes[i] = stop.value
        if on_done is not None:
            on_done(i)
