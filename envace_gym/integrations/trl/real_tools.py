"""The baseline: standard GRPO with a domain's real tools, in TRL's own tool loop. :class:`RealToolsBaseline`
builds the three things ``GRPOTrainer`` needs for it (dataset, ``environment_factory``, reward) from one
domain, so they cannot disagree; :func:`real_tools_environment` and :func:`real_tools_reward` are its parts."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import Any

from ...domains.domain import Domain
from ...domains.registry import make_domain
from ...domains.reward import as_reward_result, score_reference
from ...domains.task import Task
from ...domains.trajectory import CallRecord, Trajectory
from ...episode.config import REWARDS
from ...tools.schema import ToolCall
from .dataset import task_dataset

logger = logging.getLogger(__name__)


def real_tools_environment(domain: str | Domain) -> type:
    """An ``environment_factory`` class for ``GRPOTrainer``: its public methods are the domain's real tools
    (validated against the domain's schemas first, like in the env), run on a fresh executor per episode.

    TRL's loop has no scripted users, so this fits domains whose tasks have a single user turn (``units``,
    ``bank``). The dataset needs ``task_id`` and the conversational ``prompt`` (``task_dataset(...,
    conversational=True)``); pair it with :func:`real_tools_reward`.
    """
    dom = make_domain(domain)
    executor_class = type(dom.make_executor(dom.tasks("train")[0]))
    offered = sorted({name for task in dom.tasks("train")[:200] for name in dom.whitelist(task)})

    class RealToolsEnvironment:
        def reset(self, task_id: str | None = None, **kwargs: Any) -> None:
            self.task: Task = dom.task(task_id)
            self.executor = dom.make_executor(self.task)
            self.records: list[CallRecord] = []
            return None

        def _call(self, name: str, arguments: dict[str, Any]) -> str:
            call = ToolCall(name, arguments, id=f"call_{len(self.records)}")
            check = dom.tools.validate(call, dom.whitelist(self.task))
            if not check.ok:
                self.records.append(CallRecord(len(self.records), call, None, error=check.error))
                return json.dumps(check.error.to_payload())
            result = self.executor.execute(call)
            self.records.append(CallRecord(len(self.records), call, "real", result))
            return json.dumps(result)

    for name in offered:
        setattr(RealToolsEnvironment, name, _tool_method(name, executor_class.tool_functions[name]))
    RealToolsEnvironment.__name__ = f"{dom.name.capitalize()}RealTools"
    return RealToolsEnvironment


def _tool_method(name: str, fn: Any) -> Any:
    def method(self: Any, **arguments: Any) -> str:
        return self._call(name, arguments)

    return functools.update_wrapper(method, fn)  # the real tool's name, docstring and signature (via __wrapped__)


def real_tools_reward(domain: str | Domain, reward: str = "domain"):
    """The domain's reward for the real-tools baseline: the calls the episode's environment saw, plus the
    final answer (the completion's last assistant message). ``reward="reference"`` scores the task's reference
    calls and answer facts instead (:func:`~envace_gym.domains.reward.score_reference`), as an executor-free
    EnvACE run does, so the two differ only in who answers the calls."""
    dom = make_domain(domain)
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")

    def reward(completions: list[Any], environments: list[Any], **kwargs: Any) -> list[float | None]:
        out: list[float | None] = []
        successes: list[float] = []
        for completion, env in zip(completions, environments, strict=True):
            answer = _final_text(completion)
            trajectory = Trajectory(env.task, (), tuple(env.records), (answer,) if answer else (), _said(completion))
            try:
                result = (
                    score_reference(env.task, trajectory)
                    if reward == "reference"
                    else as_reward_result(dom.score(env.task, trajectory), dom.name)
                )
            except Exception as exc:  # a verifier that fails masks the episode, never a silent 0
                why = f"{type(exc).__name__}: {exc}"
                logger.warning("reward of %s masked: the verifier failed (%s)", env.task.id, why)
                out.append(None)
                reward.masked_episodes += 1  # type: ignore[attr-defined]
                continue
            if result.score is None:
                reward.masked_episodes += 1  # type: ignore[attr-defined]
            out.append(result.score)
            successes.append(float(result.success))
        if successes and kwargs.get("log_metric") is not None:  # TRL logs it as "success", as the EnvACE path does
            kwargs["log_metric"]("success", sum(successes) / len(successes))
        return out

    reward.__name__ = f"{dom.name}_reward"
    reward.masked_episodes = 0  # type: ignore[attr-defined]  # episodes it could not score, in this process
    return reward


def _final_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion)):
        if message.get("role") == "assistant" and not message.get("tool_calls") and message.get("content"):
            return str(message["content"])
    return ""


def _said(completion: Any) -> tuple[str, ...]:
    """Every text the completion's assistant wrote, its call turns' prose included."""
    if isinstance(completion, str):
        return (completion,) if completion.strip() else ()
    return tuple(
        m["content"]
        for m in completion
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"].strip()
    )


@dataclass(frozen=True)
class RealToolsBaseline:
    """Standard GRPO with ``domain``'s real tools: ``PackedGRPOTrainer(model, args=..., **baseline.trainer_kwargs())``.

    Args:
        domain: A domain name, folder or :class:`~envace_gym.domains.domain.Domain`.
        reward: ``"domain"`` (the domain's score of the calls the episode made) or ``"reference"`` (the task's
            reference calls and answer facts, as an executor-free EnvACE run is scored).
        size: How many training tasks the dataset holds (default: all).
    """

    domain: str | Domain
    reward: str = "domain"
    size: int | None = None

    def trainer_kwargs(self) -> dict[str, Any]:
        """``train_dataset`` (conversational prompts with task ids), ``environment_factory`` and ``reward_funcs``."""
        domain = make_domain(self.domain)
        return {
            "train_dataset": task_dataset(domain, size=self.size, conversational=True),
            "environment_factory": real_tools_environment(domain),
            "reward_funcs": [real_tools_reward(domain, self.reward)],
        }
