"""One episode of world rehearsal, independent of the Gymnasium API and of how text is generated.

:meth:`Episode.step` is a generator: it takes the agent's Act text, does everything that needs no model
(parse, validate, route, real or cached answers), *yields* the rehearsal prompts it needs generated, gets
the generations sent back, and returns a :class:`StepOutcome`. :class:`~envace_gym.env.RehearsalEnv`
answers the yields with its own policy; a vector env or a rollout collector answers the yields of many
episodes with one batched call. The logic reads top to bottom as METHOD.md describes it:

    Act turn  → parse → validate (format, whitelist, schema) → route each call
              → real executor | reference cache | Rehearse (policy, fresh prompt per call)
              → tool messages → next Act prompt, or a scripted user turn, or the end and the reward.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .domains import CallRecord, Domain, RewardResult, Task, Trajectory
from .errors import DomainError, EnvACEError, ErrorCode, ToolError
from .executors import ReferenceCache
from .parsing import DEFAULT_LIMITS, Limits, parse_act, parse_execution_result
from .policy import Generation, SamplingParams
from .simulator import EXECUTORS, RehearsalConfig, choose_route, rehearsal_messages, rehearsal_prompt
from .tools import ToolCall

ON_INVALID = ("terminate", "feedback")


@dataclass(frozen=True)
class EpisodeConfig:
    """Episode rules shared by the single and the vector environment.

    Attributes:
        executor: Who answers tool calls: ``"rehearsal"``, ``"real"``, ``"cached"`` or ``"mixed"``.
        p_real: With ``"mixed"``, the probability that a call goes to the real executor.
        on_invalid: ``"terminate"`` (the paper: the episode ends with reward 0) or ``"feedback"`` (the
            typed error becomes the tool's response and the episode goes on).
        max_turns: Most Act turns before truncation (``None``: the domain's own limit).
        max_user_turns: Most user turns before truncation.
        rehearsal: How the Rehearse role is prompted and sampled.
        limits: Bounds on Act turns and JSON.
    """

    executor: str = "rehearsal"
    p_real: float = 0.5
    on_invalid: str = "terminate"
    max_turns: int | None = None
    max_user_turns: int = 30
    rehearsal: RehearsalConfig = field(default_factory=RehearsalConfig)
    limits: Limits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        if self.on_invalid not in ON_INVALID:
            raise ValueError(f"on_invalid must be one of {ON_INVALID}, got {self.on_invalid!r}")
        if not 0.0 <= self.p_real <= 1.0:
            raise ValueError(f"p_real must be in [0, 1], got {self.p_real}")


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt the episode needs generated, with what it is for."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    role: str = "rehearse"
    call_id: str = ""


@dataclass
class StepOutcome:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def render_for_model(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the chat template should see them: an assistant turn is shown exactly as the model
    wrote it (its raw text already holds the ``<tool_call>`` blocks), so structured ``tool_calls`` are dropped."""
    return [{k: v for k, v in m.items() if k != "tool_calls"} for m in messages]


class Episode:
    """The state of one episode: conversation, real executor, scripted users, records.

    Args:
        domain: The domain (tools, reward, executor).
        task: The task being played.
        config: Episode rules.
        tokenizer: The policy's tokenizer (renders prompts and observations).
        rng: The environment's ``np_random``: every random choice (routes, sampling seeds) comes from it.
        max_context: The policy's token budget (prompt + completion).
        act_max_new_tokens: Tokens reserved for the next Act turn in the context guard.
    """

    def __init__(
        self,
        domain: Domain,
        task: Task,
        config: EpisodeConfig,
        tokenizer: Any,
        rng: np.random.Generator,
        *,
        max_context: int = 8192,
        act_max_new_tokens: int = 512,
    ) -> None:
        self.domain, self.task, self.config, self.tokenizer, self.rng = domain, task, config, tokenizer, rng
        self.max_context, self.act_max_new_tokens = max_context, act_max_new_tokens
        self.whitelist = domain.whitelist(task)
        self.tools_openai = domain.tools.to_openai(self.whitelist)
        self.candidates = [domain.tools[n] for n in self.whitelist]
        self.executor = None
        if config.executor in ("real", "mixed"):
            self.executor = domain.make_executor(task)
            if self.executor is None:
                raise DomainError(f"domain {domain.name!r} has no real executor; use executor='rehearsal' or 'cached'")
        self.cache = ReferenceCache(task.reference_pairs()) if config.executor == "cached" else None
        self.reference_pairs = task.reference_pairs()
        self.max_turns = config.max_turns or domain.max_turns
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": task.system_prompt or domain.system_prompt},
            {"role": "user", "content": task.prompt},
        ]
        self.pending_user_turns = list(task.user_turns)
        self.user_turns = 1
        self.turn = 0
        self.records: list[CallRecord] = []
        self.answers: list[str] = []
        self.done = False
        self.reward_result: RewardResult | None = None

    # -- rendering ------------------------------------------------------------------------------------
    def observation(self) -> str:
        """The next Act prompt, rendered by the policy's chat template with this task's tools."""
        return self.tokenizer.apply_chat_template(
            render_for_model(self.messages), tools=self.tools_openai, add_generation_prompt=True, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def trajectory(self) -> Trajectory:
        return Trajectory(self.task, tuple(copy.deepcopy(self.messages)), tuple(self.records), tuple(self.answers))

    def base_info(self) -> dict[str, Any]:
        return {
            "task_id": self.task.id,
            "turn": self.turn,
            "executor": self.config.executor,
            "messages": copy.deepcopy(self.messages),
        }

    # -- the step -------------------------------------------------------------------------------------
    def step(self, action: str) -> Generator[list[GenerationRequest], list[Generation], StepOutcome]:
        """Play one Act turn. Yields rehearsal requests; returns the outcome."""
        if self.done:
            raise EnvACEError("this episode is over; call reset() before step()")
        self.turn += 1
        info = {"tool_calls": [], "calls": [], "rehearsals": [], "error": None}
        parsed = parse_act(action, self.config.limits)
        calls = [replace(c, id=f"call_{self.turn}_{i}") for i, c in enumerate(parsed.calls)]
        message: dict[str, Any] = {"role": "assistant", "content": action if isinstance(action, str) else ""}
        if calls and parsed.error is None:
            message["tool_calls"] = [c.to_openai() for c in calls]
        self.messages.append(message)
        info["tool_calls"] = [c.to_json() for c in calls]

        if parsed.error is not None:  # a malformed turn: nothing of it is executed
            self.records.append(CallRecord(self.turn, None, None, error=parsed.error))
            return self._after_error(parsed.error, [], info)

        if parsed.is_final_answer:
            self.answers.append(parsed.content)
            if not self.pending_user_turns:
                return self._finish(info, terminated=True)
            self.messages.append({"role": "user", "content": self.pending_user_turns.pop(0)})
            self.user_turns += 1
            return self._continue(info)

        # Validate every call before answering any: a malformed call ends the turn cheaply.
        responses: dict[str, Any] = {}
        errors: dict[str, ToolError] = {}
        for call in calls:
            check = self.domain.tools.validate(call, self.whitelist)
            if not check.ok:
                errors[call.id] = check.error  # type: ignore[assignment]
        if errors and self.config.on_invalid == "terminate":
            for call in calls:
                self.records.append(CallRecord(self.turn, call, None, error=errors.get(call.id)))
            first = next(iter(errors.values()))
            return self._after_error(first, [(c, errors.get(c.id)) for c in calls], info)

        routes: dict[str, str] = {}
        to_rehearse: list[ToolCall] = []
        for call in calls:
            if call.id in errors:
                continue
            hit, cached = self.cache.lookup(call) if self.cache is not None else (False, None)
            route = choose_route(self.config.executor, self.rng, self.config.p_real, hit)
            routes[call.id] = route
            if route == "cache":
                responses[call.id] = cached
            elif route == "real":
                try:
                    responses[call.id] = self.executor.execute(call)  # type: ignore[union-attr]
                except Exception as exc:  # the executor's bug, reported as data; the episode survives it
                    errors[call.id] = ToolError(
                        ErrorCode.EXECUTION_ERROR,
                        f"{call.name} failed: {type(exc).__name__}: {exc}"[:300],
                        {"tool": call.name},
                        source="executor",
                    )
            else:
                to_rehearse.append(call)

        if to_rehearse:
            results = yield from self._rehearse(to_rehearse, action, info)
            for call in to_rehearse:
                result, error = results[call.id]
                if error is None:
                    responses[call.id] = result
                else:
                    errors[call.id] = error

        for call in calls:
            self.records.append(
                CallRecord(self.turn, call, routes.get(call.id), responses.get(call.id), errors.get(call.id))
            )
        info["calls"] = [r.to_dict() for r in self.records[-len(calls) :]]
        if errors and self.config.on_invalid == "terminate":
            first = next(errors[c.id] for c in calls if c.id in errors)
            return self._after_error(first, [(c, errors.get(c.id)) for c in calls], info, responses)
        for call in calls:
            self._tool_message(call, errors[call.id].to_payload() if call.id in errors else responses[call.id])
        if errors:
            info["error"] = next(errors[c.id] for c in calls if c.id in errors).to_dict()
        return self._continue(info)

    def _rehearse(
        self, calls: list[ToolCall], action: str, info: dict[str, Any]
    ) -> Generator[list[GenerationRequest], list[Generation], dict[str, tuple[Any, ToolError | None]]]:
        """Rehearse ``calls`` in one batch; resample those whose result fails a ``returns`` schema."""
        cfg = self.config.rehearsal
        history = self.messages[:-1]  # the conversation before this Act turn, which is shown raw
        prompts: dict[str, tuple[int, ...]] = {}
        for call in calls:
            chat = rehearsal_messages(
                call, self.domain.tools[call.name], self.candidates, self.reference_pairs, history, action, cfg
            )
            prompts[call.id] = tuple(self.encode(rehearsal_prompt(self.tokenizer, chat, cfg)))
        outcome: dict[str, tuple[Any, ToolError | None]] = {}
        todo = list(calls)
        for attempt in range(cfg.returns_resamples + 1):
            budget = self.max_context - cfg.max_new_tokens
            fits = [c for c in todo if len(prompts[c.id]) <= budget]
            for call in todo:
                if call not in fits:
                    outcome[call.id] = (None, _overflow(len(prompts[call.id]), budget))
            if not fits:
                break
            params = cfg.sampling(seed=int(self.rng.integers(2**31)))
            generations = yield [GenerationRequest(prompts[c.id], params, "rehearse", c.id) for c in fits]
            retry = []
            for call, gen in zip(fits, generations, strict=True):
                text = ("<execution_result>\n" if cfg.prefill else "") + gen.text
                read = parse_execution_result(text, self.config.limits)
                error = read.error
                if error is None:
                    error = self.domain.tools[call.name].validate_result(read.result)
                info["rehearsals"].append(
                    {
                        "call_id": call.id,
                        "name": call.name,
                        "attempt": attempt,
                        "prompt_ids": list(gen.prompt_ids),
                        "completion_ids": list(gen.completion_ids),
                        "logprobs": list(gen.logprobs),
                        "text": gen.text,
                        "finish_reason": gen.finish_reason,
                        "accepted": error is None,
                        "error": error.to_dict() if error else None,
                    }
                )
                outcome[call.id] = (read.result, error)
                if error is not None and error.code is ErrorCode.RESULT_SCHEMA_MISMATCH:
                    retry.append(call)
            todo = retry
            if not todo:
                break
        return outcome

    # -- endings --------------------------------------------------------------------------------------
    def _tool_message(self, call: ToolCall, payload: Any) -> None:
        self.messages.append(
            {
                "role": "tool",
                "tool_call_id": call.id,
                "name": call.name,
                "content": json.dumps(payload, ensure_ascii=False),
            }
        )

    def _after_error(
        self,
        error: ToolError,
        calls: list[tuple[ToolCall, ToolError | None]],
        info: dict[str, Any],
        responses: Mapping[str, Any] | None = None,
    ) -> StepOutcome:
        info["error"] = error.to_dict()
        if not calls:  # the turn could not be read: one tool message carries the error
            self.messages.append(
                {"role": "tool", "name": "", "content": json.dumps(error.to_payload(), ensure_ascii=False)}
            )
        for call, err in calls:
            self._tool_message(call, err.to_payload() if err else (responses or {}).get(call.id, {"skipped": True}))
        if self.config.on_invalid == "terminate":
            self.done = True
            self.reward_result = RewardResult(0.0, {"no_invalid_call": False})
            return self._outcome(0.0, True, False, info)
        return self._continue(info)

    def _continue(self, info: dict[str, Any]) -> StepOutcome:
        if self.turn >= self.max_turns or self.user_turns > self.config.max_user_turns:
            info["truncation"] = "max_turns" if self.turn >= self.max_turns else "max_user_turns"
            return self._finish(info, terminated=False)
        observation = self.observation()
        if len(self.encode(observation)) + self.act_max_new_tokens > self.max_context:
            info["truncation"] = "context"
            return self._finish(info, terminated=False, observation=observation)
        return self._outcome(0.0, False, False, info, observation)

    def _finish(self, info: dict[str, Any], *, terminated: bool, observation: str | None = None) -> StepOutcome:
        """The end: the domain's reward over the whole trajectory (also when truncated)."""
        self.done = True
        try:
            self.reward_result = self.domain.score(self.task, self.trajectory())
        except Exception as exc:  # a verifier that fails masks the episode (None), never a silent 0
            self.reward_result = RewardResult(None, {})
            info["reward_error"] = f"{type(exc).__name__}: {exc}"[:300]
        score = self.reward_result.score
        return self._outcome(0.0 if score is None else float(score), terminated, not terminated, info, observation)

    def _outcome(
        self, reward: float, terminated: bool, truncated: bool, info: dict[str, Any], observation: str | None = None
    ) -> StepOutcome:
        info.update(self.base_info())
        if self.done and self.reward_result is not None:
            info["reward_checks"] = dict(self.reward_result.checks)
            info["reward_masked"] = self.reward_result.score is None
            info["success"] = self.reward_result.success
        return StepOutcome(
            observation if observation is not None else self.observation(), reward, terminated, truncated, info
        )


def _overflow(length: int, budget: int) -> ToolError:
    return ToolError(
        ErrorCode.LIMIT_EXCEEDED,
        f"rehearsal prompt of {length} tokens exceeds the budget of {budget}",
        {"limit": "max_context", "value": length},
        source="rehearsal",
    )
