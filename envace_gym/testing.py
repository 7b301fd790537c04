"""Small in-process stand-ins for tests and quick looks: no download, no file on disk.

* :func:`tiny_tokenizer`: a byte-level BPE tokenizer trained in a few milliseconds on a fixed corpus,
  with ChatML special tokens and the same tool-capable chat template as the default model.
* :func:`tiny_policy`: a randomly initialised 2-layer Llama over that tokenizer (deterministic per seed).
* :class:`ScriptedPolicy`: a :class:`~envace_gym.policy.Policy` that answers with texts you choose,
  to drive the environment's logic without a model's randomness.
* :func:`oracle_policy`: a perfect simulator for one task (rehearses with the real executor's answers).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .models import tool_chat_template
from .parsing import RESULT_CLOSE
from .policy import Generation, SamplingParams, TransformersPolicy, stop_token_ids
from .tools import ToolCall

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    '<tool_call>\n{"name": "get_balance", "arguments": {"account_id": "ACC-1001"}}\n</tool_call>',
    '<execution_result>\n{"account_id": "ACC-1001", "balance": 250.0, "currency": "USD"}\n</execution_result>',
    '{"type": "function", "function": {"name": "convert_length", "description": "Convert a length.", '
    '"parameters": {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]}}}',
    "You are a helpful assistant. You may call one or more functions to assist with the user query.",
    "You are a precise tool simulator. Write the JSON result the tool would return.",
    "How many kilometers is 12.5 miles? Transfer 120 dollars from checking to savings. Book a flight to Rome.",
    "The quick brown fox jumps over the lazy dog 0123456789 !?.,;:-_/\\()[]{}<>'\"=+*&^%$#@~`|",
]


@functools.lru_cache(maxsize=4)
def _tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = tool_chat_template("qwen2_5")
    return fast


def tiny_tokenizer(vocab_size: int = 600) -> PreTrainedTokenizerFast:
    """A fresh copy of the tiny byte-level tokenizer (any text round-trips through it)."""
    import copy

    return copy.deepcopy(_tiny_tokenizer(vocab_size))


def tiny_model(
    tokenizer: PreTrainedTokenizerBase | None = None, *, seed: int = 0, hidden_size: int = 64, layers: int = 2
):
    """A randomly initialised Llama small enough for unit tests (~100k parameters)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def tiny_policy(seed: int = 0, **kwargs) -> TransformersPolicy:
    """A :class:`TransformersPolicy` over :func:`tiny_model` and :func:`tiny_tokenizer`."""
    tokenizer = tiny_tokenizer()
    return TransformersPolicy(tiny_model(tokenizer, seed=seed), tokenizer, **kwargs)


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
    :func:`envace_gym.simulator.rehearsal_messages` and a prefilled opening tag (the default).
    """
    executor = domain.make_executor(task)

    def respond(prompt: str) -> str:
        line = [x for x in prompt.splitlines() if x.startswith("call: ")][-1]
        call, _ = json.JSONDecoder().raw_decode(line[len("call: ") :])  # the template's end token follows
        result = executor.execute(ToolCall(call["name"], call.get("arguments", {})))
        return json.dumps(result) + "\n" + RESULT_CLOSE

    return ScriptedPolicy(respond, tokenizer)
