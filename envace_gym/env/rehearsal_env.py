"""``RehearsalEnv``: the policy as its own environment, behind Gymnasium's ``reset``/``step``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from ..domains.domain import Domain
from ..domains.registry import make_domain
from ..domains.task import Task
from ..episode.config import MAX_OBSERVATION_CHARS, EpisodeConfig
from ..episode.driver import Actor, EpisodeDriver, TurnCoroutine, open_session
from ..episode.episode import Episode
from ..episode.start import simulated_user, start_episodes
from ..episode.users import UserSimulator
from ..errors import EnvACEError, TaskTooLongError
from ..policy.factory import make_policy
from ..policy.protocol import Generation, Policy, SamplingParams
from .spaces import ActText, AnyText

DEFAULT_DOMAIN = "bank"
logger = logging.getLogger(__name__)


class RehearsalEnv(gym.Env[str, str]):
    """
    ## Description

    World rehearsal (EnvACE): an agent solves a tool-use task, and the **same policy** that writes its
    Act turns plays the environment: every tool call is validated against the domain's JSON Schemas, then
    answered by the policy in the Rehearse role (a fresh prompt per call with the task's reference
    executions as privileged context), by the domain's real executor, or by the reference results,
    depending on ``executor``. The agent continues on whatever came back.

    ## Action Space

    :class:`~envace_gym.env.spaces.ActText`: the Act turn as the model wrote it, any text. Tool calls are
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (a JSON list inside one block is
    allowed; ``"parameters"`` is an alias of ``"arguments"``). Text without a block is a final answer.

    ## Observation Space

    :class:`~envace_gym.env.spaces.AnyText`: the next Act prompt, rendered by the policy's chat template with
    the task's tools. It is safe to tokenize: a special-token string that the conversation holds as plain
    text is broken by a zero-width space, in the ids too, so tokenizing the observation gives the episode's
    ids exactly when the Act turns were passed as text (``env.unwrapped.episode.prompt_ids`` are the ids
    in any case). ``info["messages"]`` holds the same conversation as OpenAI-style messages. At most
    ``MAX_OBSERVATION_CHARS`` (1,000,000) characters: a message that would pass it is not kept and the episode
    ends (``truncation="context"``), as one past the policy's context does.

    ## Rewards

    0 on every step but the last. At the end, the domain's reward over the trajectory (a checklist in
    [0, 1]; see each domain). A malformed or invalid call, or a rehearsed ``error_tool_call``, ends the
    episode with reward 0 when ``on_invalid="terminate"``. A verifier that cannot judge gives 0 with
    ``info["reward_masked"] = True``.

    ## Starting State

    A task from ``options={"task": ...}`` (an id such as ``"bank/042"`` or a :class:`Task`), else one drawn
    from the split with ``self.np_random``. The conversation starts with the domain's system prompt and
    the task's first user message. A task whose opening prompt does not fit the policy's context (with room
    for one Act turn) or the observation space is never handed out: asked for, it raises
    :class:`~envace_gym.errors.TaskTooLongError`; drawn, it is skipped (and kept in ``unfit_tasks``).

    ## Episode End

    Terminated: a final answer when no scripted user turn is left (with a simulated user: its stop marker), or
    (``on_invalid="terminate"``) an invalid call, or ``max_errors`` tool errors (reward 0). Truncated: ``max_turns``
    Act turns, ``max_user_turns`` user turns, ``max_messages`` messages (reward 0), the next prompt not fitting the
    policy's context or the observation space, or a simulated user's reply that cannot be used (the reward is
    masked). ``info["termination_reason"]`` names the end. A simulated user's protocol (the domain's
    ``user_protocol``) may set other bounds and score a cut run 0: τ²-Bench's domains do (``envs/tau2/protocol.py``).

    ## Info

    Per step: ``tool_calls`` (parsed), ``calls`` (each call's ``route`` — ``real``, ``cache`` or
    ``rehearsal`` — result and typed ``error``), ``rehearsals`` (each rehearsal's ``prompt_ids``,
    ``completion_ids``, ``logprobs``, text and verdict, to train the Rehearse role), ``act`` (the Act
    turn's ids: generated ones with log-probs after :meth:`act`, else the tokenized action), ``error``,
    ``messages``; at the end ``reward_checks``, ``success`` and ``reward_masked``.

    ## Arguments

    ```python
    gym.make("EnvACE-Rehearsal-v0", domain="bank", policy=None, executor="rehearsal")
    ```

    * ``domain``: a registered name (``"units"``, ``"bank"``, ``"travel"``, ...), a folder, or a Domain.
    * ``policy``: ``None`` (the embedded SmolLM2-135M), ``"tiny"``, a path or hub id, a
      ``(model, tokenizer)`` pair, or any :class:`~envace_gym.policy.Policy`. Loaded at the first reset;
      with ``executor="real"`` and the default model only its tokenizer loads there, and the weights wait
      for the first :meth:`act` (stepping given actions never needs them).
    * ``config``: an :class:`~envace_gym.episode.EpisodeConfig`, how episodes are played; keyword ``settings``
      (its field names) set fields on top of it, or of the defaults: ``executor`` (``"rehearsal"`` | ``"real"`` |
      ``"cached"`` | ``"mixed"``), ``rehearsal_mode``, ``on_invalid``, ``reward``, ``max_turns``, ``max_user_turns``,
      ``max_messages``, ``max_errors``, ``tool_call_format``, ``user`` (and ``user_model``, ``user_temperature``,
      ``user_max_tokens``), ``act_sampling`` (of :meth:`act`; its ``max_new_tokens`` is also reserved in the context
      guard), ``rehearsal``, ``limits``. Each field's help: :class:`~envace_gym.episode.EpisodeSettings`
      (docs/environment.md lists them). A simulated user (``user="llm"``, ...) that writes the first message
      (τ²-Bench's scenarios) writes it at :meth:`reset`.
    * ``split``: ``"train"`` or ``"test"`` tasks.
    * ``domain_kwargs``: passed to the domain factory (e.g. ``{"num_tasks": {"train": 50}}``).
    * ``reuse_kv``: keep the conversation's KV cache between turns (:mod:`envace_gym.policy.sessions`), so a
      turn encodes only its new tokens.
    * ``render_mode``: ``"ansi"`` (returns the conversation) or ``"human"`` (prints it).
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(
        self,
        domain: str | Domain = DEFAULT_DOMAIN,
        policy: Any = None,
        config: EpisodeConfig | None = None,
        *,
        split: str = "train",
        domain_kwargs: Mapping[str, Any] | None = None,
        reuse_kv: bool = True,
        render_mode: str | None = None,
        **settings: Any,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.domain = make_domain(domain, **dict(domain_kwargs or {}))
        self.config = EpisodeConfig.build(config, **settings)
        self._user: UserSimulator | None = None
        self.split = split
        self.render_mode = render_mode
        self._policy_spec = policy
        self._policy: Policy | None = None
        self.reuse_kv = reuse_kv
        self._session: Any = None
        self.action_space = ActText(self.config.limits.max_action_chars, tuple(self.domain.tool_names()))
        self.observation_space = AnyText(MAX_OBSERVATION_CHARS)
        self._episode: Episode | None = None
        self._shown: tuple[Episode | None, int] = (None, 0)  # "human" render: the episode and messages printed
        self._act_generation: Generation | None = None
        self.unfit_tasks: set[str] = set()  # ids of tasks too long to play, skipped when drawing

    # -- policy ---------------------------------------------------------------------------------------
    @property
    def policy(self) -> Policy:
        """The policy that rehearses (built from ``policy=`` on first use)."""
        if self._policy is None:
            self._policy = make_policy(self._policy_spec)
        return self._policy

    @property
    def user(self) -> UserSimulator | None:
        """The simulated user (built from ``user=`` on first use; ``None``: the task's scripted user turns)."""
        if self._user is None and self.config.user not in (None, "scripted"):
            self._user = simulated_user(self.config, lambda: self.policy, self.domain)
        return self._user

    @property
    def session(self) -> Any:
        """The KV-reusing generation session of this env's conversation (``None`` when off or unsupported)."""
        if self._session is None and self.reuse_kv:
            self._session = open_session(self.policy)
        return self._session

    def _weights_deferred(self) -> bool:
        """``executor="real"`` with the default model: episodes need only its tokenizer until :meth:`act` (or
        a caller's generation) asks for the weights, so stepping given actions never loads them."""
        return self._policy is None and self._policy_spec in (None, "default") and self.config.executor == "real"

    def _tokenizer_and_context(self) -> tuple[Any, int]:
        if self._weights_deferred():
            from ..policy.default_model import load_default_tokenizer

            return load_default_tokenizer()
        return self.policy.tokenizer, self.policy.max_context

    @property
    def episode(self) -> Episode:
        """The episode being played (raises before the first :meth:`reset`)."""
        if self._episode is None:
            raise EnvACEError("call reset() before step()")
        return self._episode

    @property
    def current_episode(self) -> Episode | None:
        """The episode being played, or ``None`` before the first :meth:`reset`."""
        return self._episode

    def driver(self) -> EpisodeDriver:
        """The driver of this env's episodes: its policy, ``np_random`` and KV session."""
        return EpisodeDriver(self.policy, self.np_random, self.session)

    # -- Gymnasium API --------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode: the task of ``options["task"]``, else one drawn from the split with ``np_random``
        among those whose opening prompt fits (:attr:`unfit_tasks` counts the others).

        Raises:
            TaskTooLongError: The task asked for does not fit the policy's context or the observation space.
        """
        super().reset(seed=seed)
        chosen = (options or {}).get("task")
        tokenizer, max_context = self._tokenizer_and_context()
        while True:
            task = self._resolve_task(chosen)
            # a simulated user that writes the first message (τ²-Bench's) writes it now, from a generator of its own:
            # one draw per task drawn, so skipping a task known to be too long leaves the stream as it was
            user = self.user
            user_rng = np.random.default_rng(int(self.np_random.integers(2**63))) if user is not None else None
            if chosen is None and task.id in self.unfit_tasks:
                continue  # drawn again as when it was first found too long: a seed always gives the same task
            try:
                (self._episode,) = start_episodes(
                    self.domain, [task], self.config, tokenizer, max_context=max_context,
                    rng=lambda g, k: self.np_random, key=lambda i: id(self), user=user, user_rng=user_rng,
                    max_observation_chars=self.observation_space.max_length, unfit="raise",
                ).episodes  # fmt: skip
                break
            except TaskTooLongError as exc:
                if chosen is not None:
                    raise
                logger.warning("%s; drawing another task", exc)
                self.unfit_tasks.add(task.id)
        if self._session is not None:
            self._session.forget([id(self)])  # the last episode's cache is of no further use
        self._act_generation = None
        info = self._episode.base_info()
        info["task"] = task.to_dict()
        if self.render_mode == "human":
            self.render()
        return self._episode.observation(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        turn = self.turn_coroutine(action)
        if self._weights_deferred():  # the real executor answers every call: nothing here generates
            driver = EpisodeDriver(_LoadOnGenerate(self), self.np_random)
        else:
            driver = self.driver()
        (outcome,) = driver.drive([turn])
        if self.render_mode == "human":
            self.render()
        return outcome.observation, outcome.reward, outcome.terminated, outcome.truncated, outcome.info

    def render(self) -> str | None:
        """``"ansi"``: the whole conversation so far. ``"human"``: prints what it has not printed yet, each message
        once: reset and step render by themselves, so an explicit call (gymnasium's ``check_env`` makes one after
        reset) does not print the conversation a second time."""
        if self._episode is None:
            return None
        lines = [f"=== {self._episode.task.id} (turn {self._episode.turn}) ==="]
        for m in self._episode.messages:
            label = m["role"] if m["role"] != "tool" else f"tool {m.get('name', '')}"
            lines.append(f"[{label}] {m['content']}")
        if self.render_mode != "human":
            return "\n".join(lines)
        episode, shown = self._shown
        new = lines[1:][shown:] if episode is self._episode else lines
        if new:
            print("\n".join(new))
        self._shown = (self._episode, len(lines) - 1)
        return None

    def turn_coroutine(self, action: str, act: Generation | None = None) -> TurnCoroutine:
        """The current episode's step for ``action``, for a driver to run (as :meth:`step` does, or a vector
        env, batched with others). ``act`` is the generation that wrote ``action`` (default: the one kept by
        the last :meth:`act`); it is used only if its text is ``action``, else the text is tokenized as given."""
        episode = self.episode
        kept, self._act_generation = self._act_generation, None
        act = act if act is not None else kept
        if act is not None and act.text != action:
            act = None  # the caller changed the text: it is tokenized as given
        return episode.play_turn(action, act)

    # -- acting with the env's own policy -------------------------------------------------------------
    def act(self, params: SamplingParams | None = None, actor: Actor | None = None) -> str:
        """Generate the next Act turn from the current prompt: with the env's policy (sampled with ``params``,
        default ``act_sampling``), or written by ``actor`` (``actor(episodes, rng, session, keys)``, e.g. a
        :class:`~envace_gym.rollout.planner.RehearsalPlanner`).

        Passing the returned text to :meth:`step` keeps the generated ids and log-probs (``info["act"]``).
        """
        episode = self.episode  # before the policy loads: no episode is the caller's error
        (self._act_generation,) = self.driver().act([episode], params or self.config.act_sampling, actor)
        return self._act_generation.text

    def _resolve_task(self, task: Task | str | None) -> Task:
        if isinstance(task, Task):
            return task
        if isinstance(task, str):
            return self.domain.task(task, self.split)
        if task is not None:
            raise EnvACEError(f"options['task'] must be a task id or a Task, got {type(task).__name__}")
        if self.unfit_tasks and len(self.unfit_tasks) >= len(self.domain.tasks(self.split)):
            raise TaskTooLongError(
                "", f"no {self.split!r} task of domain {self.domain.name!r} fits the policy's context or the "
                f"observation space ({len(self.unfit_tasks)} tried)",
            )  # fmt: skip
        return self.domain.sample_task(self.np_random, self.split)


class _LoadOnGenerate:
    """Stands in for a policy whose weights are not loaded yet; loads them if a generation is asked for."""

    def __init__(self, env: RehearsalEnv) -> None:
        self.env = env

    def generate(self, prompts: Any, params: SamplingParams) -> list[Generation]:
        return self.env.policy.generate(prompts, params)
