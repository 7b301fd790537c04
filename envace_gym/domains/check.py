"""The domain check: a domain author's mistakes, found when the domain loads rather than deep inside a run.

:func:`check_domain` returns every :class:`Finding`; :func:`verify_domain`, which ``make_domain`` runs on every
domain it resolves (a Python class, a folder, a dataset, an entry point, an object), runs the quick part and raises
the first error as a :class:`~envace_gym.errors.DomainError`, before any model loads. ``envace domains NAME
--check`` runs all of it and prints every finding. What is checked:

* **tools**: a ``required`` name that the object's ``properties`` lack (an error where no other property is
  allowed), and a key one letter away from a JSON Schema keyword (``"proprties"``, ``"minimun"``), which JSON
  Schema would silently ignore;
* **tasks**: that they build (a generator that raises is named with the file and line; one that cannot produce
  the tasks it declares says how many it found); that every reference call names a tool the task offers and
  passes its schema;
* **recorded results** (full check): the real executor, replaying the reference, returns what the task recorded
  (a warning: a tool may be nondeterministic);
* **the reward** (full check, on a sample): the reference solution gets full marks (a reward that cannot give
  them is almost always a bug); not at load time, since a reward may call a judge model.

A domain lists in ``known_issues`` the tasks whose reference is wrong upstream (a benchmark's own data): their
findings are warnings.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import DomainError, raised_at
from ..tools.canonical import canonical_json
from ..tools.patterns import subschemas
from ..tools.schema import ToolSchema
from .domain import Domain
from .reward import as_reward_result
from .task import SPLITS, Task
from .trajectory import CallRecord, Trajectory

logger = logging.getLogger(__name__)

# Keywords of JSON Schema (2020-12 and the drafts before it) and the annotations tool schemas carry.
_KEYWORDS = frozenset(
    """$schema $id $ref $defs $anchor $dynamicRef $dynamicAnchor $comment $vocabulary definitions id type enum const
    multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength minLength pattern maxItems minItems
    uniqueItems maxContains minContains maxProperties minProperties required dependentRequired dependencies
    properties patternProperties additionalProperties propertyNames items prefixItems additionalItems contains
    unevaluatedItems unevaluatedProperties allOf anyOf oneOf not if then else dependentSchemas format
    contentEncoding contentMediaType contentSchema title description default examples deprecated readOnly
    writeOnly nullable""".split()
)
QUICK_TASKS = 1  # tasks per split the load-time check builds (τ²'s take 0.7 s each); folders check every task


@dataclass(frozen=True)
class Finding:
    """One thing wrong with a domain: ``level`` ``"error"`` (it will go wrong) or ``"warning"`` (it may be
    intended); ``where`` names the file, class or task; ``message`` says what and how to fix it."""

    level: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.where}: {self.message}"


def check_domain(
    domain: Domain, *, tasks_per_split: int | None = None, replay: bool = True, rewards: int = 20
) -> list[Finding]:
    """Every finding about ``domain``: the first ``tasks_per_split`` tasks of each split (all of them with ``None``,
    which also proves the declared counts) and their tools, with their recorded results replayed on the real
    executor (``replay``) and, for the first ``rewards`` tasks of each split, the reward of their reference."""
    findings: list[Finding] = []
    registries: dict[int, Any] = {}  # each registry checked once (most domains share one); kept, so ids stay unique
    for split in SPLITS:
        for index, task in _tasks(domain, split, tasks_per_split, findings):
            mine = [*_tool_findings(domain, task, registries), *_reference_findings(domain, task)]
            if replay:
                mine += _result_findings(domain, task)
            if index < rewards:
                mine += _reward_findings(domain, task)
            known = domain.known_issues.get(task.id)
            if known is not None:  # wrong upstream: reported, not an error of the domain's author
                mine = [Finding("warning", f.where, f"(known: {known}) {f.message}") for f in mine]
            findings += mine
    return findings


def verify_domain(domain: Domain) -> Domain:
    """The load-time check: the first tasks of each split build, their tools and reference calls are sound (no
    executor replay, no reward: those can be slow, and a reward may call a judge). The first error is raised as a
    :class:`DomainError`, warnings are logged. Run once per domain object; returns ``domain``."""
    if getattr(domain, "_envace_verified", False):
        return domain
    findings = check_domain(domain, tasks_per_split=QUICK_TASKS, replay=False, rewards=0)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        more = f" ({len(errors) - 1} more error(s))" if len(errors) > 1 else ""
        raise DomainError(f"domain {domain.name!r}: {errors[0].where}: {errors[0].message}{more}; "
                          f"`envace domains <domain> --check` lists every finding")  # fmt: skip
    for finding in findings:
        logger.warning("domain %r: %s", domain.name, finding)
    try:
        domain._envace_verified = True  # type: ignore[attr-defined]
    except AttributeError:  # a class with __slots__: checked again next time
        pass
    return domain


# -- tools ------------------------------------------------------------------------------------------------------
def _tool_findings(domain: Domain, task: Task, seen: dict[int, Any]) -> Iterator[Finding]:
    """The schema findings of ``task``'s tools, unless their registry was checked already."""
    try:
        registry = domain.tools_for(task)
    except Exception as exc:
        yield Finding("error", _where(domain, task), f"its tools cannot be listed: {_failure(exc)}")
        return
    if id(registry) in seen:
        return
    seen[id(registry)] = registry
    shared = registry is _domain_tools(domain)
    for tool in registry:
        yield from schema_findings(tool, _where(domain) if shared else _where(domain, task))


def _domain_tools(domain: Domain) -> Any:
    try:
        return domain.tools
    except Exception:  # tasks that bring their own tools (a dataset, BFCL)
        return None


def schema_findings(tool: ToolSchema, where: str) -> Iterator[Finding]:
    """A tool's misspelt JSON Schema keywords and ``required`` names its ``properties`` lack."""
    for place, schema in _schemas(tool.parameters, "parameters"):
        for key in schema:
            if key not in _KEYWORDS:
                close = difflib.get_close_matches(key, _KEYWORDS, n=1, cutoff=0.85)
                if close:
                    yield Finding("error", f"{where}: tool {tool.name!r}", f"{place} has {key!r}, which JSON Schema "
                                  f"ignores: did you mean {close[0]!r}?")  # fmt: skip
        properties, required = schema.get("properties"), schema.get("required")
        if isinstance(properties, Mapping) and isinstance(required, list):
            missing = [name for name in required if name not in properties]
            closed = schema.get("additionalProperties") is False or (place == "parameters" and tool.strict
                     and "additionalProperties" not in schema)  # fmt: skip
            if missing and "patternProperties" not in schema:
                close = {m: difflib.get_close_matches(m, list(properties), n=1) for m in missing}
                hint = "; ".join(f"{m!r}: did you mean {c[0]!r}?" for m, c in close.items() if c)
                yield Finding(
                    "error" if closed else "warning", f"{where}: tool {tool.name!r}",
                    f"{place} requires {missing}, which its properties do not define"
                    + (" (and no other property is allowed, so no call can pass)" if closed else "")
                    + (f"; {hint}" if hint else ""),
                )  # fmt: skip


def _schemas(schema: Any, place: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if isinstance(schema, Mapping):
        yield place, schema
        for key, sub in subschemas(schema):
            yield from _schemas(sub, f"{place}/{key}")


# -- tasks ------------------------------------------------------------------------------------------------------
def _tasks(domain: Domain, split: str, limit: int | None, findings: list[Finding]) -> Iterator[tuple[int, Task]]:
    """The first ``limit`` tasks of ``split`` (all with ``None``); a task that does not build becomes a finding."""
    try:
        tasks = domain.tasks(split)
        count = len(tasks) if limit is None else min(limit, len(tasks))
    except Exception as exc:
        findings.append(Finding("error", _where(domain), f"its {split} tasks cannot be listed: {_failure(exc)}"))
        return
    for index in range(count):
        try:
            task = tasks[index]
        except Exception as exc:
            findings.append(Finding("error", _where(domain), f"{split} task {index} does not build: {_failure(exc)}"))
            return  # a generator that fails once fails the same way on
        yield index, task


def _reference_findings(domain: Domain, task: Task) -> Iterator[Finding]:
    try:
        registry, whitelist = domain.tools_for(task), domain.whitelist(task)
    except Exception as exc:
        yield Finding("error", _where(domain, task), f"its tools cannot be listed: {_failure(exc)}")
        return
    for k, turn in enumerate(task.reference):
        for call in turn.calls:
            error = registry.validate(call, whitelist).error
            if error is not None:
                yield Finding("error", _where(domain, task), f"reference turn {k} calls {call.name!r}, which fails "
                              f"validation: {error.message}; fix the reference or the tool's schema")  # fmt: skip


def _result_findings(domain: Domain, task: Task) -> Iterator[Finding]:
    """Recorded reference results against what the real executor returns when the reference is replayed."""
    try:
        executor = domain.make_executor(task)
    except Exception as exc:
        yield Finding("error", _where(domain, task), f"its real executor cannot be built: {_failure(exc)}")
        return
    if executor is None or not domain.executes_calls:
        return
    for k, turn in enumerate(task.reference):
        made = [(executor.execute_user, c, r) for c, r in zip(turn.user_calls, turn.user_results, strict=False)]
        made += [(executor.execute, c, r) for c, r in zip(turn.calls, turn.results, strict=False)]
        for run, call, recorded in made:
            try:
                real = run(call)
            except Exception as exc:
                yield Finding("error", _where(domain, task), f"reference turn {k}: {call.name} raised "
                              f"{_failure(exc)}")  # fmt: skip
                return
            if recorded is not None and canonical_json(real) != canonical_json(recorded):
                yield Finding("warning", _where(domain, task), f"reference turn {k}: {call.name} returns "
                              f"{_short(real)} when replayed, but the task records {_short(recorded)}; re-record "
                              "the results (or ignore this for a tool that is not deterministic)")  # fmt: skip


def reference_trajectory(task: Task) -> Trajectory:
    """What an episode that plays ``task``'s reference solution leaves for the reward: its calls (all valid, answered
    from their recorded results: route ``"cache"``; the user's own calls of the solution too, before the turns they
    precede), its answers, and its conversation. No executor is built (a τ² one loads a database)."""
    route = "cache"
    records: list[CallRecord] = []
    answers: list[str] = []
    said: list[str] = []
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    later_users, user_turn = list(task.user_turns), 1
    for k, turn in enumerate(task.reference, 1):
        for call, result in zip(turn.user_calls, turn.user_results, strict=False):  # on the user's side: no message
            records.append(CallRecord(k, call, route, result, None, user_turn, requestor="user"))
        calls = [c.to_openai() for c in turn.calls]
        messages.append({"role": "assistant", "content": turn.content, **({"tool_calls": calls} if calls else {})})
        if turn.content.strip():
            said.append(turn.content)
        for call, result in zip(turn.calls, turn.results, strict=False):
            records.append(CallRecord(k, call, route, result, None, user_turn))
            messages.append({"role": "tool", "name": call.name, "content": canonical_json(result)})
        if not turn.calls:
            answers.append(turn.content)
            if later_users:
                messages.append({"role": "user", "content": later_users.pop(0)})
                user_turn += 1
    return Trajectory(task, tuple(messages), tuple(records), tuple(answers), tuple(said))


def _reward_findings(domain: Domain, task: Task) -> Iterator[Finding]:
    if not task.reference:  # no reference solution (BFCL's live_relevance has no ground truth): nothing to score
        return
    try:
        result = as_reward_result(domain.score(task, reference_trajectory(task)), domain.name)
    except DomainError as exc:
        yield Finding("error", _where(domain, task), str(exc))
        return
    except Exception as exc:
        yield Finding("error", _where(domain, task), f"the reward raised on the reference solution: {_failure(exc)}")
        return
    if result.score is None:
        yield Finding("warning", _where(domain, task), "the reward masks the reference solution (score None)")
    elif not result.success:
        failed = sorted(name for name, ok in result.checks.items() if not ok)
        yield Finding("error", _where(domain, task), f"the reward gives the reference solution {result.score:.3g}, "
                      f"not full marks (failed checks: {failed}); fix the task's expected or the reward")  # fmt: skip


# -- naming places ----------------------------------------------------------------------------------------------
def _where(domain: Domain, task: Task | None = None) -> str:
    """The domain's own file or class (a folder domain: its tools.json, its tasks.jsonl line), then the task."""
    try:
        return domain.locate(task)
    except Exception:  # a domain's own locate that fails: the class will do
        return type(domain).__name__ if task is None else f"{type(domain).__name__}: task {task.id!r}"


def _failure(exc: BaseException) -> str:
    where = raised_at(exc)
    return f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")


def _short(value: Any) -> str:
    text = canonical_json(value)
    return text if len(text) <= 120 else text[:117] + "..."


__all__ = ["Finding", "check_domain", "reference_trajectory", "schema_findings", "verify_domain"]
