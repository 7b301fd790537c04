"""``envace eval``: held-out success with the real executor and the Rehearse role's fidelity, for plain acting
or for private rehearsal before each committed turn (one row per mode, budget and commit rule)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..domains.registry import make_domain
from ..episode.config import EpisodeSettings
from ..errors import EnvACEError
from ..evaluation.evaluate import EVALUATION_SETS, EvalResult, evaluate
from ..policy.factory import make_policy
from ..policy.transformers import check_model_source
from ..rollout.planner import PlannerConfig

PLAIN = "plain acting"


def run_eval(
    *,
    domain: str = "bank",
    model: str | None = None,
    backend: str = "transformers",
    split: str = "test",
    num_tasks: int = 50,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    fidelity: bool = True,
    seed: int = 0,
    trials: int = 1,
    agent_prompt: str | None = None,
    rehearse: Sequence[str] | None = None,
    budget: Sequence[int] = (2,),
    horizon: int = 3,
    commit: Sequence[str] = ("memory",),
    out: str | None = None,
    **settings: Any,
) -> list[tuple[str, EvalResult]]:
    """Evaluate ``model`` on ``domain`` as ``envace eval`` does (its flags, by name) and print the result: one
    :class:`EvalResult` for plain acting, or with ``rehearse`` a table over every mode × ``budget`` × ``commit``
    (fidelity measured in the first row only). ``settings``: how episodes are played
    (:class:`~envace_gym.episode.EpisodeSettings`' names, but the executor: evaluation's is real). ``out``: the
    results as JSON, written after every row so that an interrupted table keeps what it measured. Settings are
    checked before any model loads."""
    check_model_source(model)
    if settings.get("user") == "rehearse":
        raise EnvACEError("--user rehearse trains the user's turns and evaluation trains nothing: use --user llm")
    if set(settings) & set(EVALUATION_SETS):
        raise EnvACEError(f"evaluation sets {', '.join(sorted(set(settings) & set(EVALUATION_SETS)))} itself")
    try:
        EpisodeSettings(**settings)
    except (TypeError, ValueError) as exc:  # named as the flags name them
        raise EnvACEError(_as_flags(str(exc))) from None
    if num_tasks < 1 or trials < 1 or min(budget) < 0 or horizon < 1:
        raise EnvACEError("--num-tasks, --trials and --horizon must be at least 1, --budget at least 0")
    if agent_prompt is not None and not domain.startswith("tau2:"):
        raise EnvACEError("--agent-prompt chooses the agent's system prompt of a tau2:* domain")
    # an unknown domain fails before the model loads
    dom = make_domain(domain, **({"agent_prompt": agent_prompt} if agent_prompt else {}))
    policy = make_policy(model, backend=backend)
    runs: list[tuple[str, EvalResult]] = []
    plans: list[tuple[str | None, int, str | None]] = [(None, 0, None)]
    if rehearse:
        plans = [(m, b, c) for c in commit for m in rehearse for b in budget]
    for mode, n, rule in plans:
        planner = None
        if mode is not None and n > 0:
            planner = PlannerConfig(budget=n, mode=mode, horizon=horizon, max_new_tokens=max_new_tokens, commit=rule)
        label = PLAIN if planner is None else f"{mode}, N={n}"
        if planner is not None and list(commit) != ["memory"]:
            label += f", commit={rule}"
        if mode is not None and n == 0 and any(r[0] == PLAIN for r in runs):
            continue  # N=0 is plain acting, whatever the mode
        result = evaluate(
            policy, dom, split, num_tasks, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
            fidelity=fidelity and not runs, planner=planner, seed=seed, progress=True, trials=trials, **settings,
        )  # fmt: skip
        runs.append((label, result))
        if out:
            write_eval_json(out, runs)
        if len(plans) > 1:
            print(f"{label}: success {result.success_rate:.3f}, reward {result.mean_reward:.3f}", flush=True)
    if len(runs) == 1:
        print(format_result(runs[0][1]))
    else:
        print(format_table(runs, model, select="select" in commit or "outcome" in commit))
    return runs


def _as_flags(message: str) -> str:
    """``message`` with the settings named as ``envace eval``'s flags name them (``max_errors``: ``--max-errors``)."""
    names = "|".join(f.name for f in fields(EpisodeSettings) if "_" in f.name)
    return re.sub(rf"\b({names})\b", lambda m: "--" + m[0].replace("_", "-"), message)


def format_result(result: EvalResult) -> str:
    """One evaluation, as ``envace eval`` prints it."""
    lines = [
        f"\n{result.domain} / {result.split}: {result.episodes} episodes, {result.executor} execution, "
        f"{result.user} user",
        f"  success rate       {result.success_rate:.3f}",
        f"  mean reward        {result.mean_reward:.3f}",
    ]
    if result.trials > 1:
        lines.append(f"  pass^k             {', '.join(f'pass^{k} {v:.3f}' for k, v in result.pass_k.items())} "
                     f"({result.trials} trials per task)")  # fmt: skip
    lines.append(f"  endings            {', '.join(f'{k} {v}' for k, v in sorted(result.terminations.items()))}")
    if result.masked_episodes:
        lines.append(f"  masked episodes    {result.masked_episodes} (the verifier or judge could not score them: "
                     "out of the success rate and the reward)")  # fmt: skip
    if result.user_failures:
        lines.append(f"  user failures      {result.user_failures} (the simulated user's reply could not be used: "
                     "failed runs, reward 0)")  # fmt: skip
    if result.skipped_tasks:
        lines.append(f"  skipped tasks      {result.skipped_tasks} (their opening prompt does not fit the context)")
    if result.rehearsals:
        lines += [
            f"  rehearsals         {result.rehearsals} (of reference calls)",
            f"  parse              {result.parsed:.3f}",
            f"  returns schema ok  {result.schema_ok:.3f}",
            f"  equal to real      {result.equal_to_real:.3f} (the call's own result in the prompt: copying; "
            f"fields right {result.fields:.3f})",
            f"  ... own withheld   {result.equal_to_real_withheld:.3f} (simulation; parse "
            f"{result.parsed_withheld:.3f}, fields right {result.fields_withheld:.3f})",
            f"  policy's own calls {result.equal_to_real_own_calls:.3f} equal to real, {result.own_calls} calls "
            f"(simulation; parse {result.parsed_own_calls:.3f}, fields right {result.fields_own_calls:.3f})",
        ]
    return "\n".join(lines)


def format_table(runs: list[tuple[str, EvalResult]], model: str | None, select: bool = False) -> str:
    """Several evaluations (private-rehearsal settings), one Markdown row each."""
    first = runs[0][1]
    lines = [
        f"\n{first.domain} / {first.split}, {first.episodes} episodes, {first.executor} execution, "
        f"model {model or 'default'}",
        "| private rehearsal | success rate | mean reward | real-executor calls | Act tokens | rehearsal tokens |"
        + (" turns from a kept rehearsal |" if select else ""),
        "|---|---|---|---|---|---|" + ("---|" if select else ""),
    ]
    for label, r in runs:
        lines.append(
            f"| {label} | {r.success_rate:.3f} | {r.mean_reward:.3f} | {r.real_calls} | {r.act_tokens} "
            f"| {r.rehearsal_tokens} |" + (f" {r.kept_turns} |" if select else "")
        )
    return "\n".join(lines)


def write_eval_json(path: str, runs: list[tuple[str, Any]]) -> None:
    """The results as JSON: one object for one run, else a list, each with its ``setting``."""
    records = [{"setting": label, **r.to_dict()} for label, r in runs]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(records[0] if len(records) == 1 else records, f, indent=2)


__all__ = ["format_result", "format_table", "run_eval", "write_eval_json"]
