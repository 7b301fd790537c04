"""A :class:`~envace_gym.policy.Policy` over one or more vLLM servers (vLLM's own OpenAI-compatible server, started
with ``python -m vllm.entrypoints.openai.api_server``): rollouts on machines, or processes, of their own.

``VLLMServerPolicy`` gives back what :class:`~envace_gym.policy.vllm.VLLMPolicy` gives, so every episode,
collector and trainer path runs on it unchanged:

* **requests**: one ``POST /v1/completions`` per prompt, its prompt as token ids, the sampled ids back
  (``return_token_ids``) with each one's log-probability (``logprobs: 0``). A batch's requests are sent together
  from a thread pool (``max_concurrency``), each to the server with the fewest requests in flight (ties in turn),
  so the servers' own schedulers batch them.
* **log-probabilities**: what the server's ``--logprobs-mode`` says; a server started without
  ``--logprobs-mode processed_logprobs`` (the log-probs of the distribution sampled from, after temperature, as
  ``VLLMPolicy`` records them) is refused when its settings can be read (dev mode).
* **seeds**: a seeded batch gives each request its own seed derived from it (the same derivation as
  ``VLLMPolicy``), so the same prompt sent G times yields G samples, reproducibly whichever server serves it.
* **stops**: the tokenizer's end-of-turn ids end a completion and are kept as its last id; a stop string ends it
  just after the string (kept), as in ``VLLMPolicy``.
* **prefix reuse**: the server's own (``--enable-prefix-caching``); with ``--enable-prompt-tokens-details`` the
  cached prompt tokens it reports are counted (``cached_prompt_tokens``).
* **weights**: :meth:`VLLMServerPolicy.reload_weights` makes every server load a checkpoint folder in place
  (vLLM's ``reload_weights``, reached through ``POST /collective_rpc``: the server needs
  ``VLLM_SERVER_DEV_MODE=1``) and drop its prefix cache; :func:`write_checkpoint` writes such a folder.
* **failures**: a server that does not answer, or answers with an error, raises one
  :class:`~envace_gym.errors.ServerError` naming its URL; requests are not retried (a dead server fails the
  batch at once rather than after minutes of back-off).

TRL's ``VLLMClient`` (``trl.generation.vllm_client``) talks to the same server but sends a batch as one request
with one set of sampling settings (one seed for the whole batch: G copies of a prompt would sample alike), does
not return why a completion ended, and retries a dead server for about a minute; the requests here are built
instead. Its NCCL weight transfer is what the TRL integration uses on CUDA (docs/training.md).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from ..errors import PolicyError, ServerError
from .protocol import Generation, SamplingParams
from .tokens import stop_token_ids
from .vllm import request_fields, request_seed

DEFAULT_CONCURRENCY = 64  # requests in flight at once, over all servers
START_HINT = (
    "start it with VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model <folder> "
    "--enable-prefix-caching --logprobs-mode processed_logprobs (docs/training.md)"
)


class VLLMServerPolicy:
    """A :class:`~envace_gym.policy.Policy` that generates on vLLM servers (see the module docstring).

    Args:
        base_urls: One server's URL (``"http://host:8000"``) or several, all serving the same model.
        tokenizer: The model's tokenizer, with a chat template that accepts ``tools=``.
        max_context: Longest prompt + completion; default: the smallest ``max_model_len`` the servers report.
        connect_timeout: Seconds to wait for every server's ``/health`` at start.
        request_timeout: Seconds one request (a completion, a weight reload) may take; ``None``: no limit.
        max_concurrency: Requests in flight at once, over all servers.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        tokenizer: Any,
        *,
        max_context: int | None = None,
        connect_timeout: float = 240.0,
        request_timeout: float | None = 600.0,
        max_concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        self.urls = [u.rstrip("/") for u in urls]
        if not self.urls or len(set(self.urls)) != len(self.urls):
            raise PolicyError(f"VLLMServerPolicy needs one or more distinct server URLs, got {urls!r}")
        self.tokenizer = tokenizer
        self.request_timeout = request_timeout
        self.max_concurrency = max(1, int(max_concurrency))
        self.stop_ids = stop_token_ids(tokenizer)
        self.prompt_tokens = 0  # prompt tokens sent, and those the servers' prefix caches served (when reported)
        self.cached_prompt_tokens = 0
        self._lock = threading.Lock()
        self._in_flight = dict.fromkeys(self.urls, 0)
        self._turn = 0
        for url in self.urls:
            self._wait_until_up(url, connect_timeout)
        cards = {url: self._model_card(url) for url in self.urls}
        self.model_name = str(cards[self.urls[0]]["id"])
        for url, card in cards.items():
            if card["id"] != self.model_name:
                raise ServerError(
                    url, f"the vLLM server at {url} serves {card['id']!r}, the one at {self.urls[0]} "
                    f"{self.model_name!r}: every server must serve the same model",
                )  # fmt: skip
        lengths = [int(c["max_model_len"]) for c in cards.values() if c.get("max_model_len")]
        self.max_context = int(max_context) if max_context is not None else min(lengths, default=2048)
        for url in self.urls:
            self._check_logprobs_mode(url)

    # --- HTTP ---------------------------------------------------------------------------------------------------

    def _call(self, url: str, method: str, path: str, what: str, body: Any = None, timeout: float | None = None) -> Any:
        """One request to one server (``body`` sent as JSON), its answer's JSON (``None`` for an empty body); any
        failure is one :class:`ServerError` naming the server. (The standard library's HTTP: no dependency.)"""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.request_timeout) as response:
                status, text = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read()
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out (URLError is an OSError)
            reason = getattr(exc, "reason", None) or exc
            raise ServerError(
                url, f"the vLLM server at {url} did not answer {what} ({type(exc).__name__}: {reason}); is it still "
                f"running? If not, {START_HINT}",
            ) from None  # fmt: skip
        shown = text.decode(errors="replace")
        if status == 404 and path.split("?")[0] in ("/collective_rpc", "/server_info", "/reset_prefix_cache"):
            raise ServerError(
                url, f"the vLLM server at {url} has no {path.split('?')[0]}: restart it with VLLM_SERVER_DEV_MODE=1 in "
                "its environment (its development endpoints load new weights)",
            )  # fmt: skip
        if status != 200:
            raise ServerError(url, f"the vLLM server at {url} answered {what} with HTTP {status}: {shown[:500]}")
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise ServerError(url, f"the vLLM server at {url} answered {what} with no JSON: {shown[:200]!r}") from None

    def _wait_until_up(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._call(url, "GET", "/health", "a health check", timeout=10)
                return
            except ServerError:
                pass
            if time.monotonic() >= deadline:
                raise ServerError(url, f"no vLLM server answered at {url}/health within {timeout:g} s; {START_HINT}")
            time.sleep(1.0)

    def _model_card(self, url: str) -> Mapping[str, Any]:
        models = self._call(url, "GET", "/v1/models", "the list of its models") or {}
        if not models.get("data"):
            raise ServerError(url, f"the vLLM server at {url} lists no model at /v1/models")
        return models["data"][0]

    def get_server_info(self, url: str | None = None) -> dict[str, Any]:
        """A server's resolved settings (its ``VllmConfig`` as JSON, from dev mode's ``/server_info``): the first
        server's unless ``url`` names one. (TRL's ``VLLMClient`` has the same method; TRL's trainer reads the
        server's ``logprobs_mode`` from it.)"""
        url = url or self.urls[0]
        info = self._call(url, "GET", "/server_info?config_format=json", "its settings") or {}
        return info.get("vllm_config") or {}

    def _check_logprobs_mode(self, url: str) -> None:
        try:
            mode = self.get_server_info(url).get("model_config", {}).get("logprobs_mode")
        except ServerError:
            return  # not in dev mode: generation still works, a weight reload says what is missing
        if mode not in (None, "processed_logprobs"):
            raise ServerError(
                url, f"the vLLM server at {url} returns {mode} log-probabilities; restart it with --logprobs-mode "
                "processed_logprobs (the log-probs of the distribution it samples from, which a trainer's loss models)",
            )  # fmt: skip

    # --- generation ---------------------------------------------------------------------------------------------

    def _payload(self, prompt: Sequence[int], params: SamplingParams, index: int) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model_name,
            "prompt": [int(t) for t in prompt],
            **request_fields(params, self.stop_ids),  # as the in-process engine samples
            "return_token_ids": True,
        }
        if params.seed is not None:  # one seed per request: the same prompt G times gives G samples
            payload["seed"] = request_seed(params.seed, index)
        return payload

    def _pick(self) -> str:
        """The server with the fewest requests in flight; ties go round in turn."""
        with self._lock:
            n = len(self.urls)
            url = min(self.urls, key=lambda u: (self._in_flight[u], (self.urls.index(u) - self._turn) % n))
            self._turn = (self.urls.index(url) + 1) % n
            self._in_flight[url] += 1
        return url

    def _complete(self, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        url = self._pick()
        try:
            return url, self._call(url, "POST", "/v1/completions", "a completion request", payload) or {}
        finally:
            with self._lock:
                self._in_flight[url] -= 1

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One completion per prompt, in order; the batch's requests in flight together (see the module
        docstring). A server that fails raises one :class:`ServerError`; the requests not yet sent are dropped."""
        if not prompts:
            return []
        payloads = [self._payload(p, params, i) for i, p in enumerate(prompts)]
        pool = ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(payloads)), thread_name_prefix="vllm")
        futures = [pool.submit(self._complete, p) for p in payloads]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in futures if f in done and f.exception() is not None]
            if failed:  # the first failure in batch order; the rest would only repeat it
                raise failed[0].exception()  # type: ignore[misc]
            answers = [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return [self._generation(prompt, url, body) for prompt, (url, body) in zip(prompts, answers, strict=True)]

    def _generation(self, prompt: Sequence[int], url: str, body: Mapping[str, Any]) -> Generation:
        try:
            choice = body["choices"][0]
            ids = tuple(int(t) for t in choice["token_ids"])
            logprobs = tuple(
                float("nan") if lp is None else float(lp) for lp in (choice.get("logprobs") or {})["token_logprobs"]
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise ServerError(
                url, f"the vLLM server at {url} answered without the sampled token ids or their log-probs "
                f"({type(exc).__name__}: {exc}); it needs vLLM >= 0.11 (return_token_ids)",
            ) from None  # fmt: skip
        if len(logprobs) != len(ids):
            raise ServerError(
                url, f"the vLLM server at {url} returned {len(ids)} token ids but {len(logprobs)} log-probs"
            )
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise ServerError(url, f"the vLLM server at {url} ended a completion with finish_reason={reason!r}")
        usage = body.get("usage") or {}
        with self._lock:
            self.prompt_tokens += len(prompt)
            self.cached_prompt_tokens += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return Generation(
            prompt_ids=tuple(prompt),
            completion_ids=ids,
            logprobs=logprobs,
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=reason,
        )

    # --- weights ------------------------------------------------------------------------------------------------

    def reload_weights(self, folder: str | Path) -> None:
        """Every server loads the checkpoint in ``folder`` in place (vLLM's ``reload_weights`` through
        ``POST /collective_rpc``; dev mode) and drops its prefix cache (computed with the old weights). The folder
        must be readable by every server at this same path (:func:`write_checkpoint` writes one)."""
        path = str(Path(folder).resolve())

        def reload(url: str) -> None:
            body = {"method": "reload_weights", "kwargs": {"weights_path": path}}
            self._call(url, "POST", "/collective_rpc", f"a weight reload from {path}", body)
            done = self._call(url, "POST", "/reset_prefix_cache", "a prefix-cache reset") or {}
            if done.get("success") is False:
                raise ServerError(url, f"the vLLM server at {url} could not drop its prefix cache after a reload")

        with ThreadPoolExecutor(max_workers=len(self.urls)) as pool:
            futures = [pool.submit(reload, url) for url in self.urls]
            wait(futures)
        for future in futures:  # the first failure in server order
            future.result()


def write_checkpoint(weights: Iterable[tuple[str, Any]], folder: str | Path, config: Any = None) -> Path:
    """Write ``weights`` (names as the model's checkpoint has them, tensors) to ``folder/model.safetensors``, with
    ``config`` (a ``transformers`` config) as ``config.json``; each file replaced at once (written beside, then
    renamed), so a server never reads half a file. Returns the folder."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # copies: safetensors refuses tensors sharing storage, and LoRA unmerges in place once the walk ends
    tensors = {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in weights}
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise PolicyError("write_checkpoint needs one or more (name, tensor) pairs")
    partial = folder / "model.safetensors.partial"
    save_file(tensors, str(partial), metadata={"format": "pt"})
    os.replace(partial, folder / "model.safetensors")
    if config is not None:
        partial = folder / "config.json.partial"
        config.to_json_file(str(partial))
        os.replace(partial, folder / "config.json")
    return folder


__all__ = ["VLLMServerPolicy", "write_checkpoint"]
