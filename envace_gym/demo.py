"""``envace demo``: watch the policy rehearse a domain's tools, next to what the real tools say.

Each episode runs in ``executor="rehearsal"`` mode: the policy answers every tool call. A shadow real
executor, which the agent never sees, answers the same calls, so each rehearsed response is printed
beside the real one. Act turns come from the task's reference solution (``--act reference``, the default:
every call is a valid one, so what you watch is the Rehearse role) or from the policy (``--act policy``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from .env import RehearsalEnv
from .parsing import canonical_json
from .policy import Policy, SamplingParams, make_policy
from .simulator import RehearsalConfig
from .tools import ToolCall


@dataclass
class DemoStats:
    episodes: int = 0
    rehearsals: int = 0
    parsed: int = 0
    equal_to_real: int = 0
    reward_sum: float = 0.0


def _short(value: Any, width: int = 110) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def run_demo(
    domain: str = "bank",
    episodes: int = 3,
    act: str = "reference",
    policy: Policy | str | None = None,
    seed: int = 0,
    on_invalid: str = "feedback",
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    out: Any = None,
) -> DemoStats:
    """Run the demo; returns counts so callers (and tests) can check what happened."""
    write = out.write if out is not None else tqdm.write
    model = make_policy(policy)
    env = RehearsalEnv(
        domain,
        policy=model,
        executor="rehearsal",
        on_invalid=on_invalid,
        rehearsal=RehearsalConfig(max_new_tokens=max_new_tokens, temperature=temperature),
        act_sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
    )
    stats = DemoStats()
    name = getattr(getattr(model, "model", None), "name_or_path", "") or type(model).__name__
    write(f"envace demo: the policy ({name}) rehearses the tools of {domain!r}; Act turns from the {act}.")
    write("Rehearsed responses are the policy's; 'real' is what the domain's executor answers (never shown to it).")
    for k in tqdm(range(episodes), desc="episodes", unit="ep", disable=out is not None):
        obs, info = env.reset(seed=seed + k)
        task = env.episode.task
        shadow = env.domain.make_executor(task)
        write(f"\n[{k + 1}/{episodes}] {task.id}: {task.prompt}")
        reference = iter(task.reference)
        done, reward = False, 0.0
        while not done:
            if act == "policy":
                action = env.act()
            else:
                turn = next(reference, None)
                action = turn.text if turn is not None else "I am done."
            obs, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            write(f"  act: {_short(action)}")
            for record in info["calls"]:
                if record["route"] != "rehearsal":
                    continue
                call = ToolCall(record["name"], record["arguments"])
                real = shadow.execute(call) if shadow is not None else None
                rehearsed = (
                    record["result"]
                    if record["error"] is None
                    else f"{record['error']['code']}: {record['error']['message']}"
                )
                stats.rehearsals += 1
                stats.parsed += record["error"] is None
                same = record["error"] is None and canonical_json(record["result"]) == canonical_json(real)
                stats.equal_to_real += same
                write(f"    rehearsed: {_short(rehearsed)}")
                write(f"    real:      {_short(real)}   {'(equal)' if same else ''}")
            if info.get("error") and not info["calls"]:
                write(f"    error: {info['error']['code']}: {_short(info['error']['message'])}")
        stats.episodes += 1
        stats.reward_sum += reward
        write(f"  reward {reward:.2f}  checks {info.get('reward_checks')}")
    write(
        f"\n{stats.episodes} episodes, {stats.rehearsals} rehearsed calls: {stats.parsed} well-formed, "
        f"{stats.equal_to_real} equal to the real response; mean reward {stats.reward_sum / max(1, stats.episodes):.2f}"
    )
    return stats
