"""The Rehearse role's prompt and sampling (``separate`` mode, as in the paper); which executor answers a call is
:mod:`envace_gym.rehearsal.routing`'s.

For each pending tool call the policy gets a *fresh* two-message prompt, not a continuation of the
agent's chat: a system prompt that makes it a precise tool simulator, and a user message holding the
candidate tools, the task's reference executions (privileged context only this role sees), the
conversation so far, the agent's raw latest turn, and the call to simulate with its schema. Its answer
must be ``<execution_result>{json}</execution_result>`` (optionally after ``<think>…</think>``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..parsing.act import RESULT_CLOSE, RESULT_OPEN
from ..policy.protocol import SamplingParams
from ..tools.canonical import call_key
from ..tools.schema import ToolCall, ToolSchema

REHEARSE_SYSTEM_PROMPT = """You are a precise tool simulator. An AI agent called a tool; you play the environment and write the exact response the real tool would return.

Check the call in this order and stop at the first failure:
1. Format: the call is a JSON object with a "name" and an "arguments" object. Otherwise use code INVALID_TOOL_CALL_FORMAT.
2. Availability: the tool is one of the candidate tools. Otherwise use code TOOL_NOT_AVAILABLE.
3. Arguments: they satisfy the tool's JSON schema (required fields, types, allowed values). Otherwise use code INVALID_PARAMETERS.
4. Only then produce the result, consistent with the reference executions and the conversation. When the same call appears among the reference executions, return its recorded result unchanged.

Write the tool's response as non-empty JSON between <execution_result> and </execution_result>, exactly like the reference executions show, and nothing after the closing tag. You may think first inside <think></think>. When a check fails, the JSON is an object with one key, "error_tool_call", holding "code", "message" and "details"."""


@dataclass(frozen=True)
class RehearsalConfig:
    """How the Rehearse role is prompted and sampled.

    Attributes:
        max_new_tokens: Token budget of one rehearsal.
        temperature: Sampling temperature of rehearsals (``0``: greedy). The default, 0.3, is for using the
            environment: the untrained default model closes its ``<execution_result>`` in 56 of 60 bank
            rehearsals at 0.3, 45 at 0.6 (top-p 0.95) and 10 at 1.0 (``benchmarks/rehearsal_format.py``).
            The training paths sample rehearsals at the rollout temperature (the paper's 1.0) instead.
        top_p: Nucleus mass of rehearsals.
        prefill: Start the answer with ``<execution_result>\\n`` in the prompt, so the model writes the
            JSON directly (no ``<think>``); a strong help for small models.
        include_reference: Show the task's reference executions (the paper's privileged context).
        withhold_own_result: Leave out of those references every execution of the very call being rehearsed, so
            its result cannot be copied: what fidelity measurements use to see simulation rather than recall.
        format_examples: Executions from *other* tasks, ``(call, result)``. With ``withhold_own_result``, a call
            whose tool has no execution left in the references is shown its tool's example, labelled as another
            task's: the answer's format survives the withholding (a single-call task would otherwise leave the
            prompt with no example at all), its data does not leak.
        max_history_chars: Keep at most this many characters of the conversation (oldest dropped first).
        returns_resamples: Extra attempts when a result fails the tool's ``returns`` schema.
        stop_at_close: End the generation at ``</execution_result>`` (the contract allows nothing after it).
    """

    max_new_tokens: int = 256
    temperature: float = 0.3
    top_p: float = 1.0
    prefill: bool = True
    include_reference: bool = True
    withhold_own_result: bool = False
    format_examples: tuple[tuple[ToolCall, Any], ...] = ()
    max_history_chars: int = 6000
    returns_resamples: int = 0
    stop_at_close: bool = True

    def sampling(self, seed: int | None = None) -> SamplingParams:
        """The sampling parameters of one rehearsal batch."""
        stop = (RESULT_CLOSE,) if self.stop_at_close else ()
        return SamplingParams(self.max_new_tokens, self.temperature, self.top_p, seed=seed, stop=stop)


def rollout_sampling(
    max_new_tokens: int, temperature: float, top_p: float = 1.0
) -> tuple[SamplingParams, RehearsalConfig]:
    """The Act role's :class:`SamplingParams` and the Rehearse role's :class:`RehearsalConfig` of one rollout
    setting: both roles get the same token budget (per generation), temperature and top-p; everything else
    keeps its default. This is how evaluation, the demo and every trainer sample their rollouts."""
    return (
        SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p),
        RehearsalConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p),
    )


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=False, default=str)


def _history(messages: Sequence[Mapping[str, Any]], max_chars: int) -> str:
    lines: list[str] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        label = f"tool {m.get('name', '')}".strip() if role == "tool" else str(role)
        lines.append(f"[{label}] {m.get('content', '')}")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else "…" + text[-max_chars:]


def shown_executions(
    call: ToolCall, reference: Sequence[tuple[ToolCall, Any]], config: RehearsalConfig
) -> tuple[list[tuple[ToolCall, Any]], list[tuple[ToolCall, Any]]]:
    """What the rehearse prompt for ``call`` shows of executions: the task's references (less the very call's own,
    with ``withhold_own_result``) and, when that leaves none of ``call``'s tool, one example from another task;
    nothing without ``include_reference``."""
    if not config.include_reference:
        return [], []
    if not config.withhold_own_result:
        return list(reference), []
    own = call_key(call)
    kept = [(c, r) for c, r in reference if call_key(c) != own]
    if any(c.name == call.name for c, _ in kept):
        return kept, []
    return kept, [(c, r) for c, r in config.format_examples if c.name == call.name][:1]


def rehearsal_messages(
    call: ToolCall,
    schema: ToolSchema,
    candidates: Sequence[ToolSchema],
    reference: Sequence[tuple[ToolCall, Any]],
    history: Sequence[Mapping[str, Any]],
    act_text: str,
    config: RehearsalConfig,
) -> list[dict[str, str]]:
    """The two-message chat that asks the policy to simulate ``call``.

    ``history`` is the conversation before the agent's latest turn; ``act_text`` is that turn, raw.
    """
    parts = ["# Candidate tools", "\n".join(_dump(t.to_openai()["function"]) for t in candidates)]
    reference, examples = shown_executions(call, reference, config)
    if reference:
        parts.append("# Reference executions (ground truth for this task)")
        # Shown in the very format the answer must take, so following the pattern is the easy path.
        parts.append(_executions(reference))
    if examples:
        parts.append("# Example execution of this tool (from another task: its format, not this task's data)")
        parts.append(_executions(examples))
    parts += ["# Conversation so far", _history(history, config.max_history_chars) or "(empty)"]
    parts += ["# Agent's latest turn", act_text.strip()]
    target = [f"schema of {call.name}: {_dump(schema.parameters)}"]
    if schema.returns is not None:
        target.append(f"result schema: {_dump(schema.returns)}")
    target.append(f"call: {_dump(call.to_json())}")
    parts += ["# Tool call to simulate", "\n".join(target)]
    return [{"role": "system", "content": REHEARSE_SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


def _executions(pairs: Sequence[tuple[ToolCall, Any]]) -> str:
    return "\n\n".join(f"call: {_dump(c.to_json())}\n{RESULT_OPEN}\n{_dump(r)}\n{RESULT_CLOSE}" for c, r in pairs)


def rehearsal_prompt(tokenizer: Any, messages: Sequence[Mapping[str, str]], config: RehearsalConfig) -> str:
    """Render the rehearse chat with the policy's template (no tools), plus the optional prefill."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return text + (RESULT_OPEN + "\n" if config.prefill else "")
