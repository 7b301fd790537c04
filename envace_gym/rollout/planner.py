"""Test-time private rehearsal: rehearse N futures, remember, then commit one real execution.

No reference code exists for this part of the method; this follows the paper's description (docs/method.md, "Test-time
private rehearsal"). Before each committed Act turn of a real episode, the policy rehearses privately, in its own
imagination only:

* ``parallel``: N imagined continuations from the current conversation, sampled independently;
* ``sequential``: rehearsal n starts from the conversation plus the earlier rehearsals and their
  self-assessments;

each one up to ``horizon`` Act turns, every tool call answered by the policy itself (``executor="rehearsal"``,
without the task's reference results: at test time nothing privileged is known), ending at a final answer,
which in imagination is not followed by any user turn and is not scored. After each rehearsal the policy
writes a short self-assessment with revision suggestions. Everything is condensed into a **rehearsal memory**,
a private note placed just before the committed Act turn, which then goes to the real executor
(``commit="memory"``, the paper's description). ``commit="select"`` instead commits the first Act turn of the
first rehearsal the policy's own assessment kept (``Verdict: keep``), and acts plainly when it kept none: the
committed prompt never holds a memory, which a model not trained with one can be derailed by.
``commit="outcome"`` reads no verdict: it commits the first Act turn of the rehearsal whose imagined outcome
ranks best (:func:`outcome_rank`: a final answer reached, then fewer tool errors, then fewer turns; the first
on ties), and writes no self-assessment, so a model too small to judge its own attempts can still choose
between them. ``budget=0`` is plain acting.

Accounting: rehearsals never call the real executor (``ToolExecutor.calls_executed`` counts the calls that
did), and every token generated in rehearsal is counted (:attr:`RehearsalPlanner.stats`).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np

from ..episode.driver import EpisodeDriver
from ..episode.episode import Episode
from ..policy.protocol import Generation, Policy, SamplingParams
from ..rehearsal.prompt import RehearsalConfig
from ..text import shorten

SUMMARY_WIDTH = 160  # characters of a call, result or answer in a rehearsal's summary
MODES = ("parallel", "sequential")
COMMITS = ("memory", "select", "outcome")

ASSESS_SYSTEM = (
    "You review an imagined attempt at a task, made before acting for real. Be brief and concrete: did the "
    "attempt do what the user asked? Which tool calls or arguments were wrong or missing? What should the real "
    "attempt do differently? Finish with one line: 'Verdict: keep' or 'Verdict: revise'."
)


@dataclass(frozen=True)
class PlannerConfig:
    """Private-rehearsal budget and sampling.

    Attributes:
        budget: N, imagined rehearsals before each committed Act turn (0: plain acting).
        mode: ``"parallel"`` or ``"sequential"``.
        horizon: Most imagined Act turns per rehearsal.
        max_new_tokens: Token budget of each imagined Act turn and rehearsed tool response.
        assessment_tokens: Token budget of each self-assessment.
        temperature: Sampling temperature of rehearsals and assessments.
        memory_chars: Longest rehearsal memory (its oldest parts are cut first).
        commit: ``"memory"``: the committed turn is written with the memory before it; ``"select"``: it is
            the first Act turn of the first rehearsal whose assessment ends in ``Verdict: keep`` (none kept:
            plain acting); ``"outcome"``: the first Act turn of the rehearsal whose imagined outcome ranks best
            (:func:`outcome_rank`), no self-assessment written.
    """

    budget: int = 2
    mode: str = "parallel"
    horizon: int = 3
    max_new_tokens: int = 96
    assessment_tokens: int = 64
    temperature: float = 0.7
    memory_chars: int = 3000
    commit: str = "memory"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.commit not in COMMITS:
            raise ValueError(f"commit must be one of {COMMITS}, got {self.commit!r}")
        if self.budget < 0:
            raise ValueError("budget must be >= 0")
        if self.horizon < 1:  # 0 would fall back to the episode's own turn limit
            raise ValueError(f"horizon must be at least 1, got {self.horizon}")


class RehearsalPlanner:
    """Writes committed Act turns for a batch of real episodes, after private rehearsal.

    Use it as the collector's ``actor`` (``collect_rollouts(..., actor=planner)``), through
    :class:`PrivateRehearsal` around a single env, or directly: ``planner(episodes, rng, session)``.
    """

    def __init__(
        self, policy: Policy, config: PlannerConfig | None = None, act_sampling: SamplingParams | None = None
    ) -> None:
        self.policy = policy
        self.config = config or PlannerConfig()
        self.act_sampling = act_sampling or SamplingParams(max_new_tokens=self.config.max_new_tokens, temperature=0.0)
        self.stats = {"rehearsals": 0, "rehearsal_tokens": 0, "committed_turns": 0, "kept_turns": 0}
        self.last_memories: list[str] = []

    # -- the committed turn ---------------------------------------------------------------------------
    def __call__(
        self,
        episodes: Sequence[Episode],
        rng: np.random.Generator,
        session: Any = None,
        keys: Sequence[Hashable] | None = None,
    ) -> list[Generation]:
        keys = list(keys) if keys is not None else [e.key for e in episodes]
        driver = EpisodeDriver(self.policy, rng, session)
        self.stats["committed_turns"] += len(episodes)
        if self.config.budget == 0:  # plain acting: exactly the collector's own call
            self.last_memories = [""] * len(episodes)
            return driver.generate([e.prompt_ids for e in episodes], self.act_sampling, keys)
        notes: list[list[str]] = [[] for _ in episodes]
        kept: list[Generation | None] = [None] * len(episodes)  # commit="select": the first kept first turn
        best: list[tuple[tuple[int, int, int], Generation] | None] = [None] * len(episodes)  # commit="outcome"
        rounds = 1 if self.config.mode == "parallel" else self.config.budget
        per_round = self.config.budget if self.config.mode == "parallel" else 1
        for _ in range(rounds):
            starts = [(i, self._memory(notes[i])) for i in range(len(episodes)) for _ in range(per_round)]
            forks = [self._fork(episodes[i], memory, rng) for i, memory in starts]
            first_turns = self._imagine(forks, driver)
            judged = self.config.commit != "outcome"  # the outcome rule reads no assessment: none is written
            assessments = self._assess(forks, driver) if judged else [""] * len(forks)
            for (i, _), imagined, first, assessment in zip(starts, forks, first_turns, assessments, strict=True):
                notes[i].append(self._summary(imagined, assessment, len(notes[i]) + 1))
                if kept[i] is None and verdict(assessment) == "keep":
                    kept[i] = first
                rank = outcome_rank(imagined)
                if best[i] is None or rank < best[i][0]:  # strictly better: the first wins ties
                    best[i] = (rank, first)
        self.last_memories = [self._memory(n) for n in notes]
        if self.config.commit == "outcome":
            self.stats["kept_turns"] += len(episodes)
            return [b[1] for b in best]  # type: ignore[index]  # every episode had at least one rehearsal
        if self.config.commit == "select":
            plain = [i for i, k in enumerate(kept) if k is None]
            self.stats["kept_turns"] += len(episodes) - len(plain)
            gens = driver.generate([episodes[i].prompt_ids for i in plain], self.act_sampling, [keys[i] for i in plain])
            for i, gen in zip(plain, gens, strict=True):
                kept[i] = gen
            return kept  # type: ignore[return-value]  # every slot is filled now
        prompts = [e.prompt_with_note(m)[0] for e, m in zip(episodes, self.last_memories, strict=True)]
        # The memory changes the prompt's middle, so these prompts continue no cached conversation; the session
        # still encodes the part they share with the forks (system prompt, tools, the conversation so far) once.
        return driver.generate(prompts, self.act_sampling)

    # -- imagination ----------------------------------------------------------------------------------
    def _fork(self, episode: Episode, memory: str, rng: np.random.Generator) -> Episode:
        config = replace(
            episode.config,
            executor="rehearsal",
            rehearsal_mode="separate",
            on_invalid="feedback",
            max_turns=self.config.horizon,
            rehearsal=RehearsalConfig(
                max_new_tokens=self.config.max_new_tokens, temperature=self.config.temperature, include_reference=False
            ),
        )
        return episode.fork(config, np.random.default_rng(int(rng.integers(2**31))), note=memory or None)

    def _imagine(self, forks: list[Episode], driver: EpisodeDriver) -> list[Generation]:
        """Play the forks to their end; returns each fork's first Act turn."""
        params = SamplingParams(max_new_tokens=self.config.max_new_tokens, temperature=self.config.temperature)
        first_turns: list[Generation] = []

        def keep_first(live: Sequence[int], moves: Sequence[Any]) -> None:
            if not first_turns:
                first_turns.extend(moves)

        # forks have no key: their prompts are fresh, the session shares only their prefixes
        driver.run(forks, params, on_round=keep_first)
        self.stats["rehearsals"] += len(forks)
        self.stats["rehearsal_tokens"] += sum(len(r.completion_ids) for f in forks for r in f.rows)  # Act + Rehearse
        return first_turns

    def _assess(self, forks: list[Episode], driver: EpisodeDriver) -> list[str]:
        prompts = []
        for imagined in forks:
            chat = [
                {"role": "system", "content": ASSESS_SYSTEM},
                {"role": "user", "content": imagined.chat.neutralize(_transcript(imagined))},
            ]
            prompts.append(imagined.chat.encode(imagined.chat.render(chat)))
        params = SamplingParams(max_new_tokens=self.config.assessment_tokens, temperature=self.config.temperature)
        gens = driver.generate(prompts, params)
        self.stats["rehearsal_tokens"] += sum(len(g.completion_ids) for g in gens)
        return [g.text.strip() for g in gens]

    def _summary(self, fork: Episode, assessment: str, n: int) -> str:
        lines = [f"Rehearsal {n}:"]
        for record in fork.records:
            call = record.call
            if call is None:
                lines.append("- a malformed tool call")
                continue
            outcome = record.error.code.value if record.error else shorten(record.result, SUMMARY_WIDTH)
            lines.append(f"- {call.name}({shorten(dict(call.arguments), SUMMARY_WIDTH)}) -> {outcome}")
        if fork.answers:
            lines.append(f"- answer: {shorten(fork.answers[-1], SUMMARY_WIDTH)}")
        if assessment:
            lines.append(f"Self-assessment: {assessment}")
        return "\n".join(lines)

    def _memory(self, notes: list[str]) -> str:
        if not notes:
            return ""
        text = "\n\n".join(notes)
        text = text[-self.config.memory_chars :]
        return (
            "Rehearsal memory (private: imagined attempts, no tool was really called). Use it to act better now.\n\n"
            + text
        )


def outcome_rank(fork: Episode) -> tuple[int, int, int]:
    """How an imagined attempt ended, lower ranking better: no final answer reached (0/1), then its tool errors
    (malformed calls and calls answered with an error), then its Act turns. All of it is what the rehearsal
    itself shows: nothing real is known in imagination."""
    errors = sum(1 for r in fork.records if r.call is None or r.error is not None)
    return (0 if fork.answers else 1, errors, fork.transcript.turn)


def verdict(assessment: str) -> str | None:
    """The last ``Verdict: keep`` / ``Verdict: revise`` of a self-assessment (lower case), else None."""
    found = re.findall(r"verdict\W*(keep|revise)", assessment, flags=re.IGNORECASE)
    return found[-1].lower() if found else None


def _transcript(fork: Episode) -> str:
    """The task, the real conversation before the fork, and the imagined attempt, each labelled as what it is."""
    user = next(m["content"] for m in fork.messages if m["role"] == "user")
    start = fork.transcript.initial_messages

    def shown(messages: list[dict[str, Any]]) -> list[str]:
        labels = [f"tool {m.get('name', '')}".strip() if m["role"] == "tool" else m["role"] for m in messages]
        return [f"[{label}] {shorten(m['content'], 400)}" for label, m in zip(labels, messages, strict=True)]

    real = shown(fork.messages[2:start])
    return "\n".join([f"Task: {user}", *(["So far (real):", *real] if real else []), "Imagined attempt:",
                      *shown(fork.messages[start:])])  # fmt: skip


class PrivateRehearsal(gym.Wrapper):
    """A Gymnasium wrapper around a real-executor :class:`~envace_gym.env.RehearsalEnv` whose :meth:`act`
    rehearses privately before writing the committed Act turn; :meth:`step` is the env's own, with the
    accounting added to ``info["private_rehearsal"]`` (real-executor calls so far, rehearsal tokens so far)."""

    def __init__(self, env: gym.Env, config: PlannerConfig | None = None) -> None:
        super().__init__(env)
        inner = env.unwrapped
        self.planner = RehearsalPlanner(inner.policy, config, inner.config.act_sampling)

    def act(self) -> str:
        return self.env.unwrapped.act(actor=self.planner)

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        executor = self.env.unwrapped.episode.executor
        info["private_rehearsal"] = {
            "budget": self.planner.config.budget,
            "mode": self.planner.config.mode,
            "real_calls": executor.calls_executed if executor is not None else 0,
            "rehearsal_tokens": self.planner.stats["rehearsal_tokens"],
            "memory": self.planner.last_memories[0] if self.planner.last_memories else "",
        }
        return obs, reward, terminated, truncated, info
