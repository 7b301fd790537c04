"""The paper's reward: a checklist per user turn, each item judged pass/fail by an LLM with a strict JSON verdict.

For every user turn of a task, each checklist's items for that turn are judged against that turn of the agent's
trajectory. A (checklist, turn) scores ``Σ weight · pass``, or 0 when a tool call failed in that turn; the episode's
reward is the mean over every (checklist, turn) of the task (turns the agent never reached score 0). A judge that
cannot be read (a verdict that is not the strict JSON after ``retries`` resamples, a timeout, a transport error)
masks the episode (``RewardResult(None)``, counted in :attr:`ChecklistJudge.failures`), never a silent 0.

Backends, both ``complete(prompts) -> [text or None]`` over chat prompts:

* :class:`TransformersJudge`: an in-process model (the default model, a path, or any policy), all the items of an
  episode in one batched generation;
* :class:`~envace_gym.endpoint.ChatEndpoint`: an OpenAI-compatible ``/chat/completions`` endpoint (SGLang, vLLM,
  TGI, ``transformers serve`` or a hosted API), with concurrent requests and a timeout.

Verdicts are cached by (item, turn transcript), so the episodes of a GRPO group that did the same thing pay once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..endpoint import ChatBackend, Prompt
from ..errors import DomainError
from ..policy.protocol import SamplingParams
from ..text import strict_loads
from ..tools.canonical import canonical_json
from .reward import RewardResult
from .task import Task
from .trajectory import Trajectory

logger = logging.getLogger("envace_gym")

JUDGE_SYSTEM = (
    "You are a strict evaluator of an AI assistant's work. You get one turn of a conversation between a user and "
    "an assistant that uses tools, and one checklist item. Decide whether the turn satisfies the item's pass "
    'condition. Reply with JSON only, exactly {"pass": true, "reason": "..."} or {"pass": false, "reason": "..."}.'
)


@dataclass(frozen=True)
class ChecklistItem:
    """One checklist item (the paper's fields; only ``question`` is required)."""

    question: str
    pass_condition: str = ""
    weight: float = 1.0
    focus_on: str = ""
    failure_examples: Sequence[str] = ()
    required_for_next_turn: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChecklistItem:
        if not isinstance(data, Mapping) or not isinstance(data.get("question"), str):
            raise DomainError(f"a checklist item needs a 'question' string, got {str(data)[:120]}")
        failures = data.get("failure_examples") or ()
        return cls(
            question=data["question"],
            pass_condition=str(data.get("pass_condition", "")),
            weight=float(data.get("weight", 1.0)),
            focus_on=str(data.get("focus_on", "")),
            failure_examples=tuple(map(str, failures)) if isinstance(failures, (list, tuple)) else (str(failures),),
            required_for_next_turn=bool(data.get("required_for_next_turn", False)),
        )

    def key(self) -> str:
        return canonical_json([self.question, self.pass_condition, self.focus_on, list(self.failure_examples)])


def checklists_of(task: Task) -> list[list[list[ChecklistItem]]]:
    """``task.expected["checklist_list"]`` as items: ``[checklist][user turn][item]``."""
    raw = task.expected.get("checklist_list")
    if not raw:
        raise DomainError(
            f"task {task.id!r} has no checklist (expected['checklist_list']); write them with `envace checklists`"
        )
    return [[[ChecklistItem.from_dict(item) for item in turn] for turn in checklist] for checklist in raw]


def turn_transcripts(trajectory: Trajectory) -> list[str]:
    """The conversation split by user turn: the user's message, then every assistant step and tool result of it."""
    turns: list[list[str]] = []
    for m in trajectory.messages[1:]:  # the system prompt is the same for every turn
        role, content = m.get("role"), m.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        if role == "user" and "name" not in m:  # a scripted user turn (an error sent back as a user message is named)
            turns.append([f"USER: {text}"])
        elif turns and role == "assistant":
            calls = m.get("tool_calls") or []
            shown = [f"CALL {c['function']['name']}({json.dumps(c['function']['arguments'], ensure_ascii=False)})"
                     for c in calls]  # fmt: skip
            turns[-1].append("ASSISTANT: " + ("\n".join(shown) if shown else text))
        elif turns:
            turns[-1].append(f"TOOL RESULT: {text}")
    return ["\n".join(t) for t in turns]


def judge_prompt(item: ChecklistItem, transcript: str) -> Prompt:
    lines = [f"Conversation turn:\n{transcript}", "", f"Checklist item: {item.question}"]
    if item.focus_on:
        lines.append(f"Focus on: {item.focus_on}")
    if item.pass_condition:
        lines.append(f"Pass condition: {item.pass_condition}")
    if item.failure_examples:
        lines.append("Examples of failure: " + "; ".join(item.failure_examples))
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


def read_verdict(text: str | None) -> bool | None:
    """``{"pass": bool, ...}`` (optionally in a ```json fence) → the bool; anything else → ``None``."""
    if not isinstance(text, str):
        return None
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        value = strict_loads(body)
    except ValueError:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("pass"), bool):
        return None
    return value["pass"]


@dataclass
class ChecklistJudge:
    """The checklist reward as a ``(task, trajectory) -> RewardResult`` callable (a domain's ``reward=``).

    Args:
        backend: A :class:`TransformersJudge`, a :class:`~envace_gym.endpoint.ChatEndpoint` or any
            :class:`~envace_gym.endpoint.ChatBackend`.
        retries: Resamples of a verdict that is not the strict JSON before the episode is masked.
        cache: Keep verdicts by (item, turn transcript).
    """

    backend: ChatBackend
    retries: int = 2
    cache: bool = True
    failures: int = 0  # episodes masked because the judge could not be read
    judged: int = 0  # verdicts asked of the backend (cache hits excluded)
    _verdicts: dict[str, bool] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, task: Task, trajectory: Trajectory) -> RewardResult:
        checklists = checklists_of(task)
        transcripts = turn_transcripts(trajectory)
        failed_turns = {r.user_turn for r in trajectory.calls if r.error is not None}
        asks: dict[str, tuple[ChecklistItem, str]] = {}
        for checklist in checklists:
            for t, items in enumerate(checklist):
                if t < len(transcripts):
                    for item in items:
                        key = canonical_json([item.key(), transcripts[t]])
                        if key not in self._verdicts:
                            asks[key] = (item, transcripts[t])
        verdicts = self._ask(asks)
        if verdicts is None:
            with self._lock:
                self.failures += 1
            logger.warning("checklist judge: no readable verdict for task %s; the episode is masked", task.id)
            return RewardResult(None, {"judge_read": False})
        scores, checks = [], {}
        for c, checklist in enumerate(checklists):
            for t, items in enumerate(checklist):
                turn = f"c{c}.t{t + 1}"
                checks[f"{turn}.reached"] = t < len(transcripts)
                if t >= len(transcripts):  # a turn the episode never reached scores 0
                    scores.append(0.0)
                    continue
                passed = [verdicts[canonical_json([i.key(), transcripts[t]])] for i in items]
                checks[f"{turn}.no_tool_error"] = (t + 1) not in failed_turns
                score = sum(i.weight for i, ok in zip(items, passed, strict=True) if ok)
                scores.append(score if checks[f"{turn}.no_tool_error"] else 0.0)
                for k, ok in enumerate(passed):
                    checks[f"{turn}.{k}"] = ok
        return RewardResult(sum(scores) / len(scores) if scores else None, checks)

    def _ask(self, asks: Mapping[str, tuple[ChecklistItem, str]]) -> dict[str, bool] | None:
        """Verdicts for every key asked and every cached one, or ``None`` if any asked stays unreadable."""
        with self._lock:
            verdicts = dict(self._verdicts)  # this call's own view: another thread's cache changes do not reach it
        todo = {k: v for k, v in asks.items() if k not in verdicts}
        for attempt in range(self.retries + 1):
            if not todo:
                break
            keys = list(todo)
            try:
                texts = list(self.backend.complete([judge_prompt(*todo[k]) for k in keys], attempt=attempt))
            except Exception as exc:  # a backend's own failure is a failed judgment, never a crashed episode
                logger.warning("checklist judge: the backend failed (%s: %s)", type(exc).__name__, exc)
                texts = []
            texts = texts if len(texts) == len(keys) else [None] * len(keys)
            with self._lock:
                self.judged += len(keys)
            for key, text in zip(keys, texts, strict=True):
                verdict = read_verdict(text)
                if verdict is not None:
                    verdicts[key] = verdict
                    del todo[key]
        if todo:
            return None
        if self.cache:
            with self._lock:
                self._verdicts.update({k: verdicts[k] for k in asks})
        return verdicts


class TransformersJudge:
    """A judge model in process: ``model`` is ``"default"`` (the embedded model), a path, or a
    :class:`~envace_gym.policy.Policy`. Every prompt of a call goes into one batched generation."""

    def __init__(self, model: Any = "default", sampling: SamplingParams | None = None) -> None:
        from ..policy.factory import make_policy

        self.policy = make_policy(model)
        self.sampling = sampling or SamplingParams(max_new_tokens=96, temperature=0.6, top_p=0.8, seed=0)

    def complete(self, prompts: Sequence[Prompt], attempt: int = 0) -> list[str | None]:
        tok = self.policy.tokenizer
        ids = [
            tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False) for p in prompts
        ]
        try:
            seed = None if self.sampling.seed is None else self.sampling.seed + attempt  # a resample: a new draw
            return [g.text for g in self.policy.generate(ids, replace(self.sampling, seed=seed))]
        except Exception as exc:  # a failing model is a failed judgment, never a crashed episode
            logger.warning("checklist judge: the model failed (%s: %s)", type(exc).__name__, exc)
            return [None] * len(prompts)


__all__ = [
    "ChecklistItem",
    "ChecklistJudge",
    "TransformersJudge",
    "checklists_of",
    "judge_prompt",
    "read_verdict",
    "turn_transcripts",
]
