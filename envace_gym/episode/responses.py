"""How a tool response enters an episode, whoever wrote it (a real tool, the reference cache, the Rehearse role):
as escaped JSON in the chat, with the rehearsal that wrote it recorded in the step's ``info``."""

from __future__ import annotations

import json
from typing import Any

from ..errors import ErrorCode, ToolError
from ..policy.protocol import Generation
from ..text import clean_text
from ..tools.schema import ToolCall
from .types import CallState


def dump(value: Any) -> str:
    """A tool response as it enters the chat: JSON with ``<`` and ``>`` escaped (``\\u003c``, same value), so
    no content, real or rehearsed, can spell a special token or a ``<tool_call>`` tag into the conversation."""
    text = json.dumps(value, ensure_ascii=False)
    return clean_text(text).replace("<", "\\u003c").replace(">", "\\u003e")


def payload(state: CallState) -> Any:
    """What the tool message of an answered call carries: its typed error, else its response."""
    return state.error.to_payload() if state.error is not None else state.response


def tool_message(call: ToolCall, content: Any) -> dict[str, Any]:
    """The tool message answering ``call``: a text as it is (cleaned), anything else :func:`dump`-ed."""
    text = clean_text(content) if isinstance(content, str) else dump(content)
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text}


def overflow(length: int, budget: int) -> ToolError:
    """The error of a rehearsal whose prompt leaves no room for its response in the policy's context."""
    return ToolError(
        ErrorCode.LIMIT_EXCEEDED,
        f"rehearsal prompt of {length} tokens exceeds the budget of {budget}",
        {"limit": "max_context", "value": length},
        source="rehearsal",
    )


def record_rehearsal(
    info: dict[str, Any], call: ToolCall, attempt: int, gen: Generation, error: ToolError | None
) -> None:
    """One rehearsal (a ``returns`` resample is another ``attempt``) into ``info["rehearsals"]``."""
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
