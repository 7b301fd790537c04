"""``envace demo``: watch the policy rehearse a domain's tools, next to what the real tools say.

Episodes are played by the rollout collector in ``executor="rehearsal"`` mode: the policy answers every
tool call. Afterwards a shadow real executor, which the agent never saw, answers the same calls in the same
order, so each rehearsed response is printed beside the real one. Act turns come from the task's reference
solution (``--act reference``, the default: every call is a valid one, so what you watch is the Rehearse
role) or from the policy (``--act policy``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..domains.registry import make_domain
from ..evaluation.fidelity import check_rehearsal
from ..policy.factory import make_policy
from ..policy.protocol import Policy
from ..rehearsal.prompt import rollout_sampling
from ..rollout.collector import collect_rollouts
from ..text import shorten


@dataclass
class DemoStats:
    episodes: int = 0
    rehearsals: int = 0
    parsed: int = 0
    equal_to_real: int = 0
    reward_sum: float = 0.0


def _line(value: Any) -> str:
    """A message or a result, on one line of at most 110 characters."""
    return shorten(value, 110, one_line=True)


def run_demo(
    domain: str = "bank",
    episodes: int = 3,
    act: str = "reference",
    policy: Policy | str | None = None,
    seed: int = 0,
    on_invalid: str = "feedback",
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    rehearsal_mode: str = "separate",
    out: Any = None,
) -> DemoStats:
    """Run the demo and print it (to ``out`` if given); returns counts so callers can check what happened."""
    write = out.write if out is not None else (lambda line: print(line, end=""))
    dom = make_domain(domain)  # a broken domain fails before the model loads
    model = make_policy(policy)
    rng = np.random.default_rng(seed)
    tasks = [dom.sample_task(rng) for _ in range(episodes)]
    name = getattr(getattr(model, "model", None), "name_or_path", "") or type(model).__name__
    write(f"envace demo: the policy ({name}) rehearses the tools of {dom.name!r} ({rehearsal_mode} mode); ")
    write(
        f"Act turns from the {act}.\n'real' is what the domain's executor answers for the same call (never shown to the agent).\n"
    )
    act_sampling, rehearsal = rollout_sampling(max_new_tokens, temperature)
    batch = collect_rollouts(
        model,
        dom,
        tasks,
        act=act,
        executor="rehearsal",
        rehearsal_mode=rehearsal_mode,
        act_sampling=act_sampling,
        rehearsal=rehearsal,
        on_invalid=on_invalid,
        seed=seed,
        progress=out is None,
    )
    stats = DemoStats()
    for k, (task, episode) in enumerate(zip(tasks, batch.episodes, strict=True)):
        write(f"\n[{k + 1}/{episodes}] {task.id}: {task.prompt}\n")
        shadow = dom.make_executor(task)
        records = {c.call.id: c for c in episode.calls if c.call is not None}
        for message in episode.messages[2:]:
            if message["role"] == "assistant":
                write(f"  act: {_line(message['content'])}\n")
            elif message["role"] == "user":
                write(f"  user: {_line(message['content'])}\n")
            elif message["role"] == "tool" and message.get("tool_call_id") in records:
                record = records[message["tool_call_id"]]
                real = shadow.execute(record.call) if shadow and record.validated and record.call else None
                if record.route != "rehearsal":
                    continue
                error = record.error
                shown = record.result if error is None else f"{error.code.value}: {error.message}"
                check = check_rehearsal(record, real)
                stats.rehearsals += 1
                stats.parsed += check.schema_ok  # well-formed: accepted as the call's result
                stats.equal_to_real += check.equal
                write(f"    rehearsed: {_line(shown)}\n")
                write(f"    real:      {_line(real)}{'   (equal)' if check.equal else ''}\n")
            elif message["role"] == "tool":
                write(f"    error: {_line(message['content'])}\n")
        stats.episodes += 1
        stats.reward_sum += episode.reward or 0.0
        write(f"  reward {episode.reward if episode.reward is not None else 'masked'}  checks {episode.checks}\n")
    mean = stats.reward_sum / max(1, stats.episodes)
    whose = (
        "the Act turns were the reference's, so this scores the reference, not the model (--act policy: the model acts)"
        if act == "reference"
        else "the model's own Act turns, on its own rehearsals"
    )
    write(
        f"\n{stats.episodes} episodes, {stats.rehearsals} rehearsed calls: {stats.parsed} well-formed, "
        f"{stats.equal_to_real} equal to the real response ({batch.stats.seconds:.1f} s)\n"
        f"mean reward {mean:.2f}: {whose}\n"
    )
    return stats


_RUN_DEMO = inspect.signature(run_demo).parameters  # run_demo()'s defaults are the command's: declared once


def _runs_demo(name: str, help: str, **metadata: Any) -> Any:
    return field(default=_RUN_DEMO[name].default, metadata={"help": help, **metadata})


@dataclass
class DemoConfig:
    """``envace demo``'s settings: :func:`run_demo`'s, and the backend that generates."""

    domain: str = _runs_demo("domain", "built-in domain name or domain folder")
    episodes: int = _runs_demo("episodes", "number of episodes")
    act: str = _runs_demo(
        "act", "who writes the Act turns: the task's reference solution or the policy", choices=["reference", "policy"]
    )
    model: str | None = field(
        default=None,
        metadata={"help": "model path or hub id; default: the embedded SmolLM2-135M; 'tiny' for a random test model"},
    )
    seed: int = _runs_demo("seed", "seed of the first episode's task draw")
    on_invalid: str = _runs_demo(
        "on_invalid",
        "what an invalid call or rehearsal does (feedback, the default here: every call is shown)",
        choices=["terminate", "feedback"],
    )
    max_new_tokens: int = _runs_demo("max_new_tokens", "token budget per generation")
    temperature: float = _runs_demo("temperature", "sampling temperature; 0 is greedy")
    rehearsal_mode: str = _runs_demo(
        "rehearsal_mode",
        "separate: a fresh simulator prompt per call (the paper's); inline: the policy continues its own chat",
        choices=["separate", "inline"],
    )
    backend: str = field(
        default="transformers",
        metadata={
            "help": "generate with transformers, or with a vLLM engine (the vllm extra)",
            "choices": ["transformers", "vllm"],
        },
    )
