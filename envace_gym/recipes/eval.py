"""``envace eval``: held-out success with the real executor and the Rehearse role's fidelity, for plain acting
or for private rehearsal before each committed turn (one row per mode, budget and commit rule)."""

from __future__ import annotations

import argparse
import inspect
import json
import re
from dataclasses import dataclass, field, fields
from typing import Any

from ..domains.registry import make_domain
from ..episode.config import EpisodeSettings, setting
from ..evaluation.evaluate import EvalResult, check_evaluation_settings, evaluate
from ..policy.factory import make_policy
from ..policy.transformers import check_model_source
from ..rollout.planner import PlannerConfig

PLAIN = "plain acting"
_EVALUATE = inspect.signature(evaluate).parameters  # evaluate()'s defaults are the command's: declared once


def _evaluates(name: str, help: str, **metadata: Any) -> Any:
    """A field of :func:`evaluate`'s keyword ``name``, with its default."""
    return field(default=_EVALUATE[name].default, metadata={"help": help, **metadata})


@dataclass
class EvalConfig(EpisodeSettings):
    """``envace eval``'s settings (``--config`` YAML works too; flags win). How the success pass's episodes are
    played are the inherited :class:`~envace_gym.episode.EpisodeSettings`, but evaluation chooses the executor
    itself (real tools, or the recorded results) and refuses what :func:`check_evaluation_settings` refuses."""

    domain: str = field(
        default="bank", metadata={"help": "domain name, folder or dataset file (envace domains lists the names)"}
    )
    model: str | None = field(
        default=None,
        metadata={"help": "model folder or hub id; default: the embedded SmolLM2-135M; 'tiny' for a random test model"},
    )
    backend: str = field(
        default="transformers",
        metadata={
            "help": "generate with transformers, or with a vLLM engine (the vllm extra; a model folder or hub id)",
            "choices": ["transformers", "vllm"],
        },
    )
    split: str = _evaluates("split", "which tasks to evaluate on", choices=["train", "test"])
    num_tasks: int = _evaluates("num_tasks", "the first N tasks of the split")
    max_new_tokens: int = _evaluates("max_new_tokens", "token budget of each Act turn and each rehearsal")
    temperature: float = _evaluates("temperature", "sampling temperature; 0 is greedy (the paper evaluates at 0.6)")
    top_p: float = _evaluates("top_p", "nucleus mass when sampling (the paper: 0.95)")
    fidelity: bool = _evaluates(
        "fidelity",
        "the rehearsal-fidelity passes (reference calls with and without their own results, the policy's own "
        "calls: each rehearsed and compared with the real results); --no-fidelity skips them",
    )
    seed: int = _evaluates("seed", "seed of the generation batches")
    trials: int = _evaluates(
        "trials",
        "episodes per task (each its own seed): reports tau2-Bench's pass^1 .. pass^k; sample (--temperature) or use "
        "a sampled user, or every trial is the same",
    )
    agent_prompt: str | None = field(
        default=None,
        metadata={
            "help": "a tau2:* domain's agent system prompt: a short instruction and the policy, or tau2-Bench's own "
            "agent prompt (for figures beside tau2's) (default: envace)",
            "choices": ["envace", "tau2"],
        },
    )
    rehearse: list[str] | None = field(
        default=None,
        metadata={
            "help": "rehearse privately before each committed Act turn (one or both modes)",
            "choices": ["parallel", "sequential"],
        },
    )
    budget: list[int] = field(
        default_factory=lambda: [2], metadata={"help": "N, rehearsals per committed turn (several: a table)"}
    )
    horizon: int = field(default=3, metadata={"help": "imagined Act turns per rehearsal"})
    commit: list[str] = field(
        default_factory=lambda: ["memory"],
        metadata={
            "help": "how the committed turn follows the rehearsals: written with their memory before it, the first "
            "turn of the first rehearsal the policy's assessment kept (none kept: plain acting), or the first turn "
            "of the rehearsal whose imagined outcome ranks best (an answer, fewer errors, fewer turns); several: a "
            "table",
            "choices": ["memory", "select", "outcome"],
        },
    )
    out: str | None = field(default=None, metadata={"help": "also write the result(s) as JSON"})
    # evaluation chooses these itself (evaluate's EVALUATION_SETS): accepted by the parser only to be refused by name
    executor: str = setting("executor", help=argparse.SUPPRESS)
    p_real: float = setting("p_real", help=argparse.SUPPRESS)

    def __post_init__(self) -> None:
        try:  # each refusal named as the flags name the settings (max_errors: --max-errors)
            super().__post_init__()  # the episode settings
            check_evaluation_settings(self.num_tasks, self.trials, self.given_settings())
            if min(self.budget) < 0 or self.horizon < 1:
                raise ValueError("--horizon must be at least 1, --budget at least 0")
            if self.agent_prompt is not None and not self.domain.startswith("tau2:"):
                raise ValueError("agent_prompt chooses the agent's system prompt of a tau2:* domain")
        except ValueError as exc:
            raise ValueError(_as_flags(str(exc))) from None

    def given_settings(self) -> dict[str, Any]:
        """The episode settings this evaluation changes from their defaults, by name (what :func:`evaluate` takes)."""
        return {name: getattr(self, name) for name in self.changed_episode_settings()}


def run_eval(config: EvalConfig) -> list[tuple[str, EvalResult]]:
    """Evaluate ``config.model`` on ``config.domain`` as ``envace eval`` does and print the result: one
    :class:`EvalResult` for plain acting, or with ``rehearse`` a table over every mode × ``budget`` × ``commit``
    (fidelity measured in the first row only). ``out``: the results as JSON, written after every row so that an
    interrupted table keeps what it measured. The settings checked themselves when ``config`` was built; the model
    source and the domain are checked here before any model loads."""
    c = config
    check_model_source(c.model)
    # an unknown domain fails before the model loads
    dom = make_domain(c.domain, **({"agent_prompt": c.agent_prompt} if c.agent_prompt else {}))
    policy = make_policy(c.model, backend=c.backend)
    runs: list[tuple[str, EvalResult]] = []
    plans: list[tuple[str | None, int, str | None]] = [(None, 0, None)]
    if c.rehearse:
        plans = [(m, b, rule) for rule in c.commit for m in c.rehearse for b in c.budget]
    for mode, n, rule in plans:
        planner = None
        if mode is not None and n > 0:
            planner = PlannerConfig(
                budget=n, mode=mode, horizon=c.horizon, max_new_tokens=c.max_new_tokens, commit=rule
            )
        label = PLAIN if planner is None else f"{mode}, N={n}"
        if planner is not None and list(c.commit) != ["memory"]:
            label += f", commit={rule}"
        if mode is not None and n == 0 and any(r[0] == PLAIN for r in runs):
            continue  # N=0 is plain acting, whatever the mode
        result = evaluate(
            policy, dom, c.split, c.num_tasks, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
            top_p=c.top_p, fidelity=c.fidelity and not runs, planner=planner, seed=c.seed, progress=True,
            trials=c.trials, **c.given_settings(),
        )  # fmt: skip
        runs.append((label, result))
        if c.out:
            write_eval_json(c.out, runs)
        if len(plans) > 1:
            print(f"{label}: success {result.success_rate:.3f}, reward {result.mean_reward:.3f}", flush=True)
    if len(runs) == 1:
        print(format_result(runs[0][1]))
    else:
        print(format_table(runs, c.model, select="select" in c.commit or "outcome" in c.commit))
    return runs


def _as_flags(message: str) -> str:
    """``message`` with the settings named as ``envace eval``'s flags name them (``max_errors``: ``--max-errors``)."""
    names = "|".join(f.name for f in fields(EvalConfig) if "_" in f.name)
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
        lines += [
            f"    {tool:<36} {f.rehearsals:>4} calls: equal {f.equal:.3f}, fields right {f.fields:.3f}"
            for tool, f in result.fidelity_by_tool.get("own_calls", {}).items()
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


__all__ = ["EvalConfig", "format_result", "format_table", "run_eval", "write_eval_json"]
