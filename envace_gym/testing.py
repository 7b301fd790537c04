"""Small in-process stand-ins for tests and quick looks: no download, no file on disk.

* :func:`tiny_tokenizer` (from :mod:`envace_gym.policy.tiny`): a byte-level BPE tokenizer trained in a few milliseconds on a fixed corpus,
  with ChatML special tokens and the same tool-capable chat template as the default model.
* :func:`tiny_policy`: a randomly initialised 2-layer Llama over that tokenizer (deterministic per seed).
* :class:`ScriptedPolicy`: a :class:`~envace_gym.policy.Policy` that answers with texts you choose,
  to drive the environment's logic without a model's randomness.
* :func:`oracle_policy`: a perfect simulator for one task (rehearses with the real executor's answers).
* :func:`taught_model` and :func:`served`: a tiny model taught one answer to given chat prompts, saved, and served
  by ``transformers serve`` on a local port, for tests of the OpenAI-compatible endpoint client.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from .parsing.act import RESULT_CLOSE
from .policy.protocol import Generation, SamplingParams
from .policy.tiny import FAMILIES, SPECIAL_TOKENS, tiny_model, tiny_policy, tiny_tokenizer
from .policy.tokens import stop_token_ids
from .tools.schema import ToolCall

Responder = Callable[[str], str]


class ScriptedPolicy:
    """A policy that writes chosen texts: a list consumed in order, or a function of the decoded prompt.

    Completion ids are the tokenized text plus the end-of-turn token; a text holding one of the request's
    stop strings is cut just after it, without the end token, as generation stops there. Log-probabilities
    are zeros. ``prompts`` records every decoded prompt it was given.
    """

    def __init__(self, responses: Sequence[str] | Responder, tokenizer: PreTrainedTokenizerBase | None = None):
        self.tokenizer = tokenizer or tiny_tokenizer()
        self.max_context = 1_000_000  # no model behind it: no context limit of its own
        self._responses = responses if callable(responses) else list(responses)
        self.prompts: list[str] = []
        self._eos = stop_token_ids(self.tokenizer)[0]

    def _next(self, prompt: str) -> str:
        if callable(self._responses):
            return self._responses(prompt)
        if not self._responses:
            raise RuntimeError("ScriptedPolicy ran out of responses")
        return self._responses.pop(0)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for prompt in prompts:
            decoded = self.tokenizer.decode(list(prompt))
            self.prompts.append(decoded)
            text = self._next(decoded)
            ends = [text.find(stop) + len(stop) for stop in params.stop if stop and stop in text]
            if ends:
                text = text[: min(ends)]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if ends and len(ids) <= params.max_new_tokens:
                finish = "stop"
            elif len(ids) < params.max_new_tokens:
                ids, finish = ids + [self._eos], "stop"
            else:  # cut like a real model would be, and say so
                ids, finish = ids[: params.max_new_tokens], "length"
                text = self.tokenizer.decode(ids)
            out.append(Generation(tuple(prompt), tuple(ids), (0.0,) * len(ids), text, finish))
        return out


def oracle_policy(domain: Any, task: Any, tokenizer: PreTrainedTokenizerBase | None = None) -> ScriptedPolicy:
    """A perfect simulator for one task: answers each rehearse prompt with what the domain's real executor
    returns for that call (state carried across calls), in the ``<execution_result>`` contract.

    It reads the call from the rehearse prompt's last ``call:`` line, so it works with the prompts of
    :func:`envace_gym.rehearsal.rehearsal_messages` and a prefilled opening tag (the default).
    """
    executor = domain.make_executor(task)

    def respond(prompt: str) -> str:
        line = [x for x in prompt.splitlines() if x.startswith("call: ")][-1]
        call, _ = json.JSONDecoder().raw_decode(line[len("call: ") :])  # the template's end token follows
        result = executor.execute(ToolCall(call["name"], call.get("arguments", {})))
        return json.dumps(result) + "\n" + RESULT_CLOSE

    return ScriptedPolicy(respond, tokenizer)


__all__ = [
    "FAMILIES",
    "SPECIAL_TOKENS",
    "ScriptedPolicy",
    "oracle_policy",
    "tiny_model",
    "tiny_policy",
    "tiny_tokenizer",
]


def taught_model(path: str | Path, prompts: Sequence[list[dict[str, str]]], answer: str, steps: int = 120) -> None:
    """Save to ``path`` a tiny model (and its tokenizer) taught to answer every chat prompt of ``prompts`` with
    ``answer`` (then its end token), greedy by default."""
    import torch

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3)
    target = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rows = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False) for p in prompts]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        for prompt in rows:
            ids = torch.tensor([prompt + target])
            labels = ids.clone()
            labels[0, : len(prompt)] = -100
            optimizer.zero_grad()
            model(input_ids=ids, labels=labels).loss.backward()
            optimizer.step()
    model.eval()
    model.generation_config.do_sample = False
    model.save_pretrained(path)
    tok.save_pretrained(path)


@contextmanager
def served(model_dir: str | Path, timeout: float = 120.0) -> Iterator[str]:
    """``transformers serve`` of ``model_dir`` on a free local port, for the ``with`` block: yields its base URL
    (``http://127.0.0.1:PORT/v1``); the server is stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cli = Path(sys.executable).with_name("transformers")
    server = subprocess.Popen(
        [str(cli), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError("transformers serve did not come up") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(timeout=30)
