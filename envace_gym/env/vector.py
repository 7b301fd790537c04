"""``RehearsalVectorEnv``: N rehearsal episodes stepped together, their generations batched."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from ..domains.domain import Domain
from ..domains.registry import make_domain
from ..episode.config import EpisodeConfig
from ..episode.driver import EpisodeDriver, open_session
from ..policy.factory import make_policy
from ..policy.protocol import Generation, SamplingParams
from ..progress import Progress, ProgressReporter
from .rehearsal_env import DEFAULT_DOMAIN, RehearsalEnv


class RehearsalVectorEnv(VectorEnv):
    """N :class:`~envace_gym.env.RehearsalEnv` episodes behind Gymnasium's vector API, sharing one policy.

    In each :meth:`step`, every rehearsal pending across the N episodes is generated in one batched call
    (one per sampling setting); :meth:`act` writes the N Act turns in one batched call too. Sub-environment
    ``i`` draws its tasks and ``mixed`` routes from its own ``np_random`` (seeded ``seed + i``); the seeds of
    the batched generations come from the vector env's ``np_random``.

    Autoreset follows Gymnasium: ``NEXT_STEP`` (default; the step after an episode ends resets that
    sub-env, ignoring its action, with reward 0) or ``SAME_STEP`` (the reset happens within the ending
    step; the final observation and info are in ``info["final_obs"]`` / ``info["final_info"]``).

    Observations and actions are tuples of strings; ``info`` is Gymnasium's dict of per-env arrays.
    Created by ``gym.make_vec("EnvACE-Rehearsal-v0", num_envs=N, vectorization_mode="vector_entry_point",
    **kwargs)`` with the same keyword arguments as :class:`RehearsalEnv`, plus ``autoreset_mode`` and
    ``progress`` (``True``: a bar per :meth:`step` of the sub-envs whose turn is done, rehearsals included;
    a callable gets ``(done, total)``; see :mod:`envace_gym.progress`).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(
        self,
        num_envs: int = 1,
        domain: str | Domain = DEFAULT_DOMAIN,
        policy: Any = None,
        config: EpisodeConfig | None = None,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        domain_kwargs: dict[str, Any] | None = None,
        progress: Progress = False,
        **env_kwargs: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        if env_kwargs.get("render_mode") is not None:  # steps run as coroutines: a sub-env's render would show resets only
            raise ValueError("RehearsalVectorEnv does not render; read a sub-env's conversation in infos['messages']")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        if self.autoreset_mode is AutoresetMode.DISABLED:
            raise ValueError("autoreset_mode DISABLED is not supported; use NEXT_STEP or SAME_STEP")
        self.metadata = {**self.metadata, "autoreset_mode": self.autoreset_mode}
        self.num_envs = num_envs
        self.progress = progress
        self.domain = make_domain(domain, **dict(domain_kwargs or {}))
        self.policy = make_policy(policy)  # one model for all sub-envs: the same weights act and rehearse
        first = RehearsalEnv(self.domain, self.policy, config, **env_kwargs)
        # one simulated user for all sub-envs, so that a round's user turns are one batch
        shared = EpisodeConfig.build(
            first.config, user=first.user, user_model=None, user_temperature=None, user_max_tokens=None
        )
        settings = {f.name for f in fields(EpisodeConfig)}
        rest = {k: v for k, v in env_kwargs.items() if k not in settings}  # split, reuse_kv
        self.envs = [first] + [RehearsalEnv(self.domain, self.policy, shared, **rest) for _ in range(num_envs - 1)]
        self.session = open_session(self.policy) if self.envs[0].reuse_kv else None  # one cache for all rows
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._acts: list[Generation | None] = [None] * num_envs

    # -- Gymnasium vector API -------------------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
            super().reset(seed=seed)
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
            # the batched generations' seeds come from np_random: seeded from the list when it is whole
            whole = all(s is not None for s in seeds)
            super().reset(seed=int(np.random.SeedSequence(seeds).generate_state(1)[0]) if whole else None)
        options = dict(options or {})
        mask = np.asarray(options.pop("reset_mask", np.ones(self.num_envs, dtype=bool)))
        if mask.shape != (self.num_envs,) or mask.dtype != np.bool_ or not mask.any():
            raise ValueError(f"options['reset_mask'] must be {self.num_envs} booleans, at least one True, got {mask!r}")
        tasks = options.pop("task", None)
        if tasks is not None and (isinstance(tasks, str) or not isinstance(tasks, (Sequence, np.ndarray))):
            tasks = [tasks] * self.num_envs
        elif tasks is not None and len(tasks) != self.num_envs:
            raise ValueError(f"options['task'] must be one task or {self.num_envs}, got {len(tasks)}")
        obs, infos = [], {}
        for i, env in enumerate(self.envs):
            if mask[i]:
                task_opts = {**options, "task": tasks[i]} if tasks is not None else options
                o, info = self._reset_one(i, seed=seeds[i], options=task_opts)
                self._needs_reset[i] = False
                self._acts[i] = None
                infos = self._add_info(infos, _present(info), i)
            else:
                o = env.episode.observation()
            obs.append(o)
        return tuple(obs), infos

    def act(self, params: SamplingParams | None = None) -> tuple[str, ...]:
        """Write the Act turn of every live sub-env with the shared policy, in one batched call.

        Passing the returned texts to :meth:`step` keeps the generated ids and log-probs.
        """
        live = [i for i in range(self.num_envs) if not self._needs_reset[i]]
        gens = self.driver().act([self.envs[i].episode for i in live], params or self.envs[0].config.act_sampling)
        actions = [""] * self.num_envs
        for i, gen in zip(live, gens, strict=True):
            self._acts[i], actions[i] = gen, gen.text
        return tuple(actions)

    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        obs: list[str] = [""] * self.num_envs
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: dict[str, Any] = {}
        stepping, coroutines = [], []
        for i, env in enumerate(self.envs):
            if self._needs_reset[i]:  # NEXT_STEP autoreset: this step only resets
                obs[i], info = self._reset_one(i)
                self._needs_reset[i] = False
                infos = self._add_info(infos, _present(info), i)
                continue
            act, self._acts[i] = self._acts[i], None
            stepping.append(i)
            coroutines.append(env.turn_coroutine(actions[i], act))
        bar = ProgressReporter(self.progress, len(coroutines), "sub-env turns", "env")
        outcomes = self.driver().drive(coroutines, on_done=lambda _: bar.update())
        bar.close()
        for i, outcome in zip(stepping, outcomes, strict=True):
            obs[i], rewards[i] = outcome.observation, outcome.reward
            terminated[i], truncated[i] = outcome.terminated, outcome.truncated
            info = outcome.info
            if outcome.terminated or outcome.truncated:
                if self.autoreset_mode is AutoresetMode.SAME_STEP:
                    final_obs, final_info = obs[i], info
                    obs[i], info = self._reset_one(i)
                    info = {**info, "final_obs": final_obs, "final_info": final_info}
                else:
                    self._needs_reset[i] = True
            infos = self._add_info(infos, _present(info), i)
        return tuple(obs), rewards, terminated, truncated, infos

    def driver(self) -> EpisodeDriver:
        """The driver of the sub-envs' episodes: the shared policy and KV session, the vector env's ``np_random``."""
        return EpisodeDriver(self.policy, self.np_random, self.session)

    def _reset_one(self, i: int, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        episode = self.envs[i].current_episode
        if self.session is not None and episode is not None:
            self.session.forget([episode.key])
        return self.envs[i].reset(**kwargs)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


def _present(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` without its ``None`` values, nested dicts too. Gymnasium batches a key by the type of the first
    sub-env's value, and a ``None`` beside a dict breaks that; a key left out is Gymnasium's "absent" (its ``_key``
    mask False)."""
    return {k: _present(v) if isinstance(v, dict) else v for k, v in info.items() if v is not None}
