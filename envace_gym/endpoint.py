"""An OpenAI-compatible chat endpoint, the one client of every model the package calls over HTTP: the checklist
judge (:mod:`envace_gym.domains.judge`) and a simulated user (:mod:`envace_gym.episode.users`).

:class:`ChatEndpoint` posts to ``/chat/completions`` (SGLang, vLLM, TGI, ``transformers serve`` or a hosted API),
several requests at a time, each bounded by a timeout. A failed request (transport, timeout, a malformed reply, a
reply cut at ``max_tokens``) is ``None``, never an exception: the caller decides what an unanswered prompt means (a
masked episode). A participant with tools (τ²-Bench's telecom user) asks :meth:`ChatEndpoint.reply`, which also
returns the tool calls the model made.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger("envace_gym")
Prompt = list[dict[str, Any]]


@dataclass(frozen=True)
class ChatReply:
    """One reply of a chat model that was offered tools: its text, and the calls it made as
    ``(id, name, arguments)`` (arguments as the model wrote them: a JSON text, or an object)."""

    content: str
    tool_calls: tuple[tuple[str, str, Any], ...] = ()


class ChatBackend(Protocol):
    def complete(self, prompts: Sequence[Prompt], attempt: int = 0) -> list[str | None]:
        """One completion per chat prompt; ``None`` where the backend failed (timeout, transport). ``attempt``
        counts the resamples of the same prompts, so a seeded backend can draw a new sample."""
        ...


class ChatEndpoint:
    """An OpenAI-compatible chat endpoint: ``base_url`` up to ``/v1`` (e.g. ``http://localhost:30000/v1``),
    ``model`` its model name, ``api_key`` its bearer token if it needs one (default: the ``ENVACE_API_KEY``
    environment variable, if set). Requests run ``max_concurrency`` at a time; each waits at most ``timeout``
    seconds."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_concurrency: int = 8,
        temperature: float = 0.6,
        top_p: float = 0.8,
        max_tokens: int | None = 256,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"an endpoint's base_url starts with http:// or https://, got {base_url!r}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        # a hosted API's key, if not given: from the environment, so that command lines need not hold it
        self.api_key = api_key if api_key is not None else os.environ.get("ENVACE_API_KEY") or None
        self.model, self.timeout = model, timeout
        self.max_concurrency = max_concurrency
        self.params: dict[str, Any] = {"temperature": temperature, "top_p": top_p}
        if max_tokens is not None:  # None: no bound of ours, the server's own
            self.params["max_tokens"] = max_tokens

    def _one(self, prompt: Prompt, tools: Sequence[dict[str, Any]] = ()) -> ChatReply | None:
        offered = {"tools": list(tools)} if tools else {}
        body = json.dumps({"model": self.model, "messages": prompt, **self.params, **offered}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                data = json.loads(response.read())
            choice = data["choices"][0]
            message = choice["message"]
            content = message.get("content") or ""
            calls = tuple(
                (c.get("id") or f"call_{i}", c["function"]["name"], c["function"].get("arguments") or {})
                for i, c in enumerate(message.get("tool_calls") or ())
            )
        except Exception as exc:  # transport (URLError, HTTPException, a timeout) or a malformed reply: no answer
            logger.warning("endpoint %s failed (%s: %s)", self.url, type(exc).__name__, exc)
            return None
        if choice.get("finish_reason") == "length":  # cut at max_tokens: a verdict or a message half-written
            logger.warning("endpoint %s: the reply ran past max_tokens (%s)", self.url, self.params.get("max_tokens"))
            return None
        if not isinstance(content, str) or not all(isinstance(name, str) for _, name, _ in calls):
            logger.warning("endpoint %s: a reply that is not a chat message", self.url)
            return None
        return ChatReply(content, calls)

    def reply(self, prompts: Sequence[Prompt], tools: Sequence[dict[str, Any]] = ()) -> list[ChatReply | None]:
        """One reply per chat prompt, each offered ``tools`` (OpenAI function schemas); ``None`` where it failed."""
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(prompts)))) as pool:
            return list(pool.map(lambda prompt: self._one(prompt, tools), prompts))

    def complete(self, prompts: Sequence[Prompt], attempt: int = 0) -> list[str | None]:
        return [None if r is None else r.content for r in self.reply(prompts)]


__all__ = ["ChatBackend", "ChatEndpoint", "ChatReply", "Prompt"]
