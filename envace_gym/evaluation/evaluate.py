"""Evaluation: task success with the **real** executor, and how faithfully the policy rehearses.

* **Success** (``executor="real"``): the policy acts on held-out tasks; every call is answered by the domain's
  real tools; the domain's reward decides. This is the number that matters. A domain without real tools (a
  dataset of conversations) is played with ``executor="cached"`` instead: a call that matches a reference call
  gets the recorded result, any other is rehearsed; ``EvalResult.executor`` says which.
* **Fidelity** of the Rehearse role: each task's reference solution is played (``act="reference"``) while the
  policy rehearses every call (``separate`` mode); each rehearsed response is compared with what the real
  executor returns for the same call in the same state (without real tools: with the recorded reference
  result of that call). Reported: the share of rehearsals that parse
  (``<execution_result>`` with JSON), that pass the tool's ``returns`` schema, and that equal the real
  response (canonical JSON). Those calls' own results sit in the rehearse prompt's references, so "equal"
  there measures **copying**. A second pass withholds each call's own executions from its references
  (``RehearsalConfig.withhold_own_result``): ``equal_to_real_withheld`` measures **simulation**. A third pass
  rehearses the policy's **own** calls: the policy acts on its own rehearsals (each call's own result withheld,
  as it would be for a call no reference made), and each rehearsal is compared with what the real executor
  returns for that call in that state (``equal_to_real_own_calls``). Each pass also reports ``fields``: the share
  of the real response's fields the rehearsal gets right, numbers within 1% (a graded "equal", which moves while
  the arithmetic is still wrong).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..domains.domain import Domain
from ..domains.registry import make_domain
from ..domains.task import Task
from ..policy.protocol import Policy
from ..progress import Progress
from ..rehearsal.prompt import rollout_sampling
from ..rollout.collector import collect_rollouts
from ..rollout.planner import PlannerConfig, RehearsalPlanner
from ..tools.executor import ReferenceCache
from ..tools.schema import ToolCall
from .fidelity import RehearsalCheck, check_rehearsal

logger = logging.getLogger("envace_gym")


EVALUATION_SETS = ("executor", "p_real", "act_sampling", "rehearsal")  # the episode settings evaluation chooses

@dataclass(frozen=True)
class ToolFidelity:
    """One fidelity pass's rehearsals of one tool, in one state of the world (see ``EvalResult.fidelity_by_tool``)."""

    rehearsals: int
    parsed: float
    equal: float
    fields: float


AFTER_CHANGE = " after a state change"  # a call made once an earlier call of its episode had changed the world


@dataclass
class EvalResult:
    domain: str  # the versioned id it was made from (units-v0), where it has one
    split: str
    episodes: int
    success_rate: float
    mean_reward: float
    executor: str = "real"  # "cached" for a domain without real tools (reference results, else rehearsal)
    user: str = "scripted"  # who answered the agent's final answers: "scripted", "llm", or an endpoint URL
    masked_episodes: int = 0  # the verifier or judge could not score them: out of success_rate and mean_reward
    user_failures: int = 0  # the simulated user's reply could not be used: failed runs (reward 0), as τ²-Bench counts
    skipped_tasks: int = 0  # too long for the policy's context (TaskTooLongError): not played, not in `episodes`
    real_calls: int = 0  # calls that reached the real executor (the committed ones)
    act_tokens: int = 0  # tokens of the committed Act turns
    rehearsal_tokens: int = 0  # tokens spent in private rehearsal (0 without a planner)
    kept_turns: int = 0  # commit="select" / "outcome": committed turns taken from a rehearsal
    rehearsals: int = 0
    parsed: float = float("nan")
    schema_ok: float = float("nan")
    equal_to_real: float = float("nan")  # the call's own result was in the prompt: copying
    fields: float = float("nan")  # share of the real responses' fields rehearsed right (numbers within 1%)
    parsed_withheld: float = float("nan")
    equal_to_real_withheld: float = float("nan")  # the call's own result withheld: simulation
    fields_withheld: float = float("nan")
    own_calls: int = 0  # the policy's own calls rehearsed in the third fidelity pass
    parsed_own_calls: float = float("nan")
    equal_to_real_own_calls: float = float("nan")  # simulation of the calls the policy itself makes
    fields_own_calls: float = float("nan")
    # pass ("copying", "withheld", "own_calls") -> tool -> its rehearsals; a tool called once an earlier call of the
    # episode had changed the real executor's state is keyed "<tool> after a state change" (get_balance after a
    # transfer): the calls a simulator must carry state for
    fidelity_by_tool: dict[str, dict[str, ToolFidelity]] = field(default_factory=dict)
    trials: int = 1  # episodes per task
    pass_k: dict[int, float] = field(default_factory=dict)  # k -> pass^k, for k = 1 .. trials (see pass_hat_k)
    terminations: dict[str, int] = field(default_factory=dict)  # why the episodes ended ("user_stop", "max_steps", ...)
    per_task: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pass_hat_k(successes: Sequence[Sequence[bool]], k: int) -> float:
    """τ²-Bench's pass^k: for each task, the chance that ``k`` of its trials, drawn without replacement, all
    succeed (``C(c, k) / C(n, k)`` with ``c`` successes in ``n`` trials), averaged over the tasks with at least
    ``k`` trials (NaN when none has). pass^1 is the success rate; pass^k falls as k grows unless every task
    succeeds always or never: the reliability the success rate hides."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    chances = [math.comb(sum(t), k) / math.comb(len(t), k) for t in successes if len(t) >= k]
    return sum(chances) / len(chances) if chances else float("nan")


def check_evaluation_settings(num_tasks: int, trials: int, settings: Mapping[str, Any]) -> None:
    """What evaluation refuses (``ValueError``), for :func:`evaluate` and ``envace eval`` alike: the episode
    settings it chooses itself (:data:`EVALUATION_SETS`), a user that would be trained (``user="rehearse"``), and
    fewer than one task or trial. ``settings``: the episode settings given, by name."""
    if settings.get("user") == "rehearse":
        raise ValueError("user='rehearse' trains the user's turns and evaluation trains nothing: use user='llm'")
    fixed = sorted(set(settings) & set(EVALUATION_SETS))
    if fixed:
        raise ValueError(f"evaluation sets {', '.join(fixed)} itself (real execution, its own sampling)")
    if num_tasks < 1 or trials < 1:
        raise ValueError(f"num_tasks and trials must be at least 1, got {num_tasks} and {trials}")


def _pass_progress(progress: Progress, before: int, total: int, label: str) -> Progress:
    """A pass that follows ``before`` episodes of ``total`` in all passes: its own named bar, or the callback
    counting over all passes."""
    if callable(progress):
        return lambda done, _: progress(before + done, total)
    if isinstance(progress, str):  # the caller's label, then which pass
        return f"{progress}: {label}"
    return label if progress else False


def evaluate(
    policy: Policy,
    domain: str | Domain,
    split: str = "test",
    num_tasks: int = 50,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    fidelity: bool = True,
    planner: PlannerConfig | None = None,
    seed: int = 0,
    progress: Progress = False,
    tasks: Sequence[Task] | None = None,
    trials: int = 1,
    format_example: bool = True,
    **settings: Any,
) -> EvalResult:
    """Success rate on the first ``num_tasks`` tasks of ``split`` with real execution, plus rehearsal fidelity.

    ``temperature`` 0 is greedy; the paper evaluates sampled, at 0.6 with ``top_p`` 0.95 (``seed`` fixes the draw).

    With ``planner``, every committed Act turn is written after private rehearsal (:mod:`envace_gym.rollout.planner`);
    ``rehearsal_tokens`` and ``real_calls`` then say what the rehearsal cost and that it called no real tool.
    ``progress``: ``True`` shows a bar per pass; a callable gets ``(done, total)`` over all its passes' episodes.
    ``settings``: how the success pass's episodes are played, as :class:`~envace_gym.episode.EpisodeSettings`
    names them (``user``, ``user_model``, ``user_temperature``, ``user_max_tokens``, ``max_messages``, ``max_errors``,
    ``on_invalid``, ``max_turns``, ...); evaluation sets the executor (real, or the recorded results) and the
    sampling itself, and refuses ``user="rehearse"`` (it trains nothing: use ``"llm"``). ``terminations`` counts why
    the episodes ended.
    ``tasks``: the tasks to evaluate instead of the first ``num_tasks`` of ``split`` (validation tasks held back
    from a training split, say); ``split`` then only names them in the result.
    ``trials``: episodes per task in the success pass (each with its own seed): ``pass_k`` holds τ²-Bench's
    pass^1 .. pass^trials (:func:`pass_hat_k`; a masked episode is not one of its task's trials). Greedy acting
    against scripted users plays the same episode every trial.
    ``format_example``: in the passes that withhold a call's own result, a tool left with no execution in the
    references is shown one execution of it from another task (:func:`format_examples`), so that what they
    measure is simulation, not whether the answer's format could be guessed; ``False``: nothing in its place.
    """
    user = settings.get("user", "scripted")
    check_evaluation_settings(num_tasks, trials, settings)
    dom = make_domain(domain)
    tasks = list(dom.tasks(split)[: min(num_tasks, len(dom.tasks(split)))]) if tasks is None else list(tasks)
    sampling, rehearsal = rollout_sampling(max_new_tokens, temperature, top_p)
    actor = RehearsalPlanner(policy, planner, sampling) if planner is not None else None
    n = len(tasks)
    total = n * trials + (3 * n if fidelity and dom.executes_calls else 0)  # the success pass, then fidelity's three
    executor = "real" if not tasks or dom.make_executor(tasks[0]) is not None else "cached"
    # A call the cache cannot answer is rehearsed, as at test time: nothing privileged (no reference execution) in
    # its prompt, since the rehearsed result enters the agent's conversation.
    real = collect_rollouts(
        policy, dom, tasks, trials, executor=executor, act_sampling=sampling, seed=seed, actor=actor,
        rehearsal=replace(rehearsal, include_reference=False), **settings,
        progress=_pass_progress(progress, 0, total, f"episodes ({executor} execution)"),
    )  # fmt: skip
    # A run its simulated user could not carry on is a failed run, as τ²-Bench counts it (training masks it
    # instead: not the agent's fault, so no gradient); a verifier that cannot score masks it here too.
    episodes = [replace(e, reward=0.0, success=False) if e.user_error else e for e in real.episodes]
    scored = [e for e in episodes if e.reward is not None]  # a masked episode is neither success nor failure
    rewards = [e.reward for e in scored]
    by_task: dict[int, list[bool]] = {}
    for e in scored:
        by_task.setdefault(e.group, []).append(e.success)
    result = EvalResult(
        domain=dom.id,
        split=split,
        episodes=len(real.episodes),
        success_rate=sum(e.success for e in scored) / len(scored) if scored else float("nan"),
        mean_reward=sum(rewards) / len(rewards) if rewards else float("nan"),  # nothing scored: no mean, not 0
        executor=executor,
        user=user if isinstance(user, str) else type(user).__name__,
        masked_episodes=len(real.episodes) - len(rewards),
        user_failures=sum(1 for e in real.episodes if e.user_error),
        skipped_tasks=real.stats.skipped_tasks,
        trials=trials,
        pass_k={k: pass_hat_k(list(by_task.values()), k) for k in range(1, trials + 1)},
        terminations=dict(Counter(e.termination_reason or "unknown" for e in real.episodes)),
        per_task=[
            {"task_id": e.task_id, "reward": e.reward, "success": e.success, "turns": e.turns,
             "termination_reason": e.termination_reason, **({"user_error": e.user_error} if e.user_error else {})}
            for e in episodes
        ],
        real_calls=sum(e.real_calls for e in real.episodes),
        rehearsal_tokens=actor.stats["rehearsal_tokens"] if actor is not None else 0,
        kept_turns=actor.stats["kept_turns"] if actor is not None else 0,
        act_tokens=real.stats.act_tokens,
    )
    if not fidelity or not dom.executes_calls:  # no real responses to compare rehearsals with
        return result
    copying = _fidelity(
        policy, dom, tasks, rehearsal, seed,
        _pass_progress(progress, n * trials, total, "rehearsal fidelity (reference acts)"),
    )  # fmt: skip
    result.rehearsals, result.parsed, result.schema_ok = copying.rehearsals, copying.parsed, copying.schema_ok
    result.equal_to_real, result.fields = copying.equal, copying.fields
    examples = format_examples(dom, tasks) if format_example else ()
    withheld = replace(rehearsal, withhold_own_result=True, format_examples=examples)
    simulation = _fidelity(
        policy, dom, tasks, withheld, seed,
        _pass_progress(progress, n * (trials + 1), total, "rehearsal fidelity (own results withheld)"),
    )  # fmt: skip
    result.parsed_withheld, result.equal_to_real_withheld = simulation.parsed, simulation.equal
    result.fields_withheld = simulation.fields
    own = _fidelity(
        policy, dom, tasks, withheld, seed,
        _pass_progress(progress, n * (trials + 2), total, "rehearsal fidelity (the policy's own calls)"),
        act_sampling=sampling,
    )  # fmt: skip
    result.own_calls, result.parsed_own_calls, result.equal_to_real_own_calls = own.rehearsals, own.parsed, own.equal
    result.fields_own_calls = own.fields
    result.fidelity_by_tool = {"copying": copying.by_tool, "withheld": simulation.by_tool, "own_calls": own.by_tool}
    return result


def format_examples(domain: Domain, evaluated: Sequence[Task], scan: int = 50) -> tuple[tuple[ToolCall, Any], ...]:
    """One reference execution per tool, from the first ``scan`` training tasks that are not ``evaluated``: the
    answer's format for the withheld passes (another task's data, so nothing of the evaluated task leaks)."""
    skip = {t.id for t in evaluated}
    found: dict[str, tuple[ToolCall, Any]] = {}
    for task in domain.tasks("train")[:scan]:
        if task.id not in skip:
            for call, result in task.reference_pairs():
                found.setdefault(call.name, (call, result))
    return tuple(found.values())


@dataclass(frozen=True)
class _FidelityPass:
    """One fidelity pass: how many rehearsals were compared, and the shares of :class:`RehearsalCheck`'s fields
    over them (NaN when none)."""

    rehearsals: int
    parsed: float
    schema_ok: float
    equal: float
    fields: float
    by_tool: dict[str, ToolFidelity]


def _fidelity(
    policy: Policy, dom: Domain, tasks: list[Any], rehearsal: Any, seed: int, progress: Progress,
    act_sampling: Any = None,
) -> _FidelityPass:
    """Each task's reference acted (or, given ``act_sampling``, the policy acting) while the policy rehearses
    every call, each rehearsal checked against the real executor's answer for the same call in the same state."""
    act = "reference" if act_sampling is None else "policy"
    rehearsed = collect_rollouts(
        policy, dom, tasks, executor="rehearsal", act=act, on_invalid="feedback", rehearsal=rehearsal,
        act_sampling=act_sampling, seed=seed, progress=progress,
    )  # fmt: skip
    checks: list[tuple[str, RehearsalCheck]] = []
    by_id = {task.id: task for task in tasks}  # a task too long to play has no episode
    for episode in rehearsed.episodes:
        task = by_id[episode.task_id]
        shadow = dom.make_executor(task)
        start = shadow.snapshot() if shadow is not None else None
        recorded = ReferenceCache(task.reference_pairs())  # the truth when there are no real tools
        for record in episode.calls:
            if not record.validated or record.call is None:
                continue
            call = record.call
            changed = shadow is not None and shadow.snapshot() != start  # before this call runs
            try:
                known, truth = (True, shadow.execute(call)) if shadow is not None else recorded.lookup(call)
            except Exception as exc:  # the tool's own bug: no truth here, and its state is unknown from here on
                logger.warning("fidelity: %s's %s raised (%s: %s); its later calls are not compared",
                               task.id, call.name, type(exc).__name__, exc)  # fmt: skip
                break
            if record.route != "rehearsal" or not known:
                continue
            checks.append((call.name + (AFTER_CHANGE if changed else ""), check_rehearsal(record, truth)))
    tools: dict[str, list[RehearsalCheck]] = {}
    for tool, check in checks:
        tools.setdefault(tool, []).append(check)
    every = [check for _, check in checks]
    return _FidelityPass(
        len(every), _share(every, "parsed"), _share(every, "schema_ok"), _share(every, "equal"), _share(every, "fields"),
        {tool: ToolFidelity(len(c), _share(c, "parsed"), _share(c, "equal"), _share(c, "fields"))
         for tool, c in sorted(tools.items())},
    )  # fmt: skip


def _share(checks: Sequence[RehearsalCheck], name: str) -> float:
    """The share of ``checks`` whose ``name`` holds (its mean, for ``fields``); NaN for none."""
    return sum(getattr(c, name) for c in checks) / len(checks) if checks else float("nan")
