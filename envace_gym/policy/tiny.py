"""Tiny in-process models for tests and quick looks: a tokenizer trained in milliseconds, a 2-layer model."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .default_model import tool_chat_template
from .tokens import stop_token_ids
from .transformers import TransformersPolicy

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


@dataclass(frozen=True)
class _Family:
    """A model family's chat layout, as a tiny tokenizer needs it: TRL's template for it and its tokens."""

    template: str  # the file name of the TRL chat template (prefix-preserving; a `_training` one where needed)
    special: tuple[str, ...]  # special tokens (the first are EOS and padding)
    eos: str
    pad: str
    bos: str | None = None
    added: tuple[str, ...] = ()  # plain added tokens (Qwen's <tool_call> is one token, but not a special one)


_CHATML = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
_LLAMA = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
          "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>")  # fmt: skip
_DEEPSEEK = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜▁pad▁｜>",
             *(f"<｜tool▁{k}｜>" for k in ("calls▁begin", "calls▁end", "call▁begin", "call▁end", "sep",
                                          "outputs▁begin", "outputs▁end", "output▁begin", "output▁end")))  # fmt: skip
FAMILIES: dict[str, _Family] = {
    "qwen2_5": _Family("qwen2_5", _CHATML, "<|im_end|>", "<|endoftext|>"),
    "qwen3": _Family("qwen3_training", _CHATML, "<|im_end|>", "<|endoftext|>", added=_QWEN_TAGS),
    "qwen3_5": _Family("qwen3_5_nothink", _CHATML, "<|im_end|>", "<|endoftext|>", added=_QWEN_TAGS),
    "llama3_1": _Family("llama3_1", _LLAMA, "<|eot_id|>", "<|finetune_right_pad_id|>", "<|begin_of_text|>"),
    "llama3_2": _Family("llama3_2", _LLAMA, "<|eot_id|>", "<|finetune_right_pad_id|>", "<|begin_of_text|>"),
    "glm4moe": _Family(
        "glm4moe",
        (
            "<|endoftext|>",
            "[MASK]",
            "[gMASK]",
            "[sMASK]",
            "<sop>",
            "<eop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|observation|>",
        ),
        "<|endoftext|>",
        "<|endoftext|>",
        added=(*_QWEN_TAGS, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    ),  # fmt: skip
    "gptoss": _Family(
        "gptoss",
        (
            "<|startoftext|>",
            "<|endoftext|>",
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|return|>",
            "<|call|>",
        ),
        "<|return|>",
        "<|endoftext|>",
        "<|startoftext|>",
    ),  # fmt: skip
    "deepseekv3": _Family(
        "deepseekv3_training",
        _DEEPSEEK,
        "<｜end▁of▁sentence｜>",
        "<｜▁pad▁｜>",
        "<｜begin▁of▁sentence｜>",
        ("<think>", "</think>"),
    ),
}


@functools.lru_cache(maxsize=16)
def _tiny_tokenizer(
    vocab_size: int, family: str = "qwen2_5", corpus: tuple[str, ...] = (), whole_words: bool = False
) -> PreTrainedTokenizerFast:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    spec = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if whole_words:  # spaces and punctuation stand alone, so a word is the same token wherever it stands
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r"[^A-Za-z0-9]"), "isolated"), pre_tokenizers.ByteLevel(False, use_regex=False)]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(spec.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((*_CORPUS, *corpus) * 4, trainer=trainer)
    if spec.added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec.added])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=spec.eos, pad_token=spec.pad, bos_token=spec.bos, unk_token=None
    )
    fast.chat_template = tool_chat_template(spec.template)
    return fast


def tiny_tokenizer(
    vocab_size: int = 600, family: str = "qwen2_5", corpus: Sequence[str] = (), whole_words: bool = False
) -> PreTrainedTokenizerFast:
    """A fresh copy of the tiny byte-level tokenizer (any text round-trips through it).

    ``corpus``: more texts to learn merges from (with a larger ``vocab_size``, a domain's own prompts come out
    shorter). ``whole_words``: spaces and punctuation are tokens of their own, so ``porch`` is one token in
    ``the porch`` and in ``"porch"``: a model trained from scratch copies a word by copying its token.

    ``family`` gives it a model family's special tokens and the chat template TRL ships for that family
    (:data:`FAMILIES`: ``qwen2_5`` (the default model's layout), ``qwen3``, ``qwen3_5``, ``llama3_1``,
    ``llama3_2``, ``glm4moe``, ``gptoss``, ``deepseekv3``). Where the family's own template is not
    prefix-preserving (Qwen3, DeepSeek-V3), TRL's training variant of it is used, as a user would.
    """
    import copy

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {sorted(FAMILIES)}")
    return copy.deepcopy(_tiny_tokenizer(vocab_size, family, tuple(corpus), whole_words))


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
    stops = stop_token_ids(tokenizer)  # a family may end turns with several tokens (gpt-oss: <|return|>, <|call|>)
    model.generation_config.eos_token_id = stops if len(stops) > 1 else tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def tiny_policy(seed: int = 0, **kwargs) -> TransformersPolicy:
    """A :class:`TransformersPolicy` over :func:`tiny_model` and :func:`tiny_tokenizer`."""
    tokenizer = tiny_tokenizer()
    return TransformersPolicy(tiny_model(tokenizer, seed=seed), tokenizer, **kwargs)


# 4 heads of 32: vLLM's CPU attention serves no head size below 32 (16, tiny_model's default, fails at the
# first generation), so the quick-look model is this wide and `--use_vllm` works with it
QUICK_LOOK_HIDDEN_SIZE = 128


def quick_look_policy(seed: int = 0) -> TransformersPolicy:
    """What ``"tiny"`` names in ``make_policy``, ``--model tiny`` and ``policy="tiny"``: :func:`tiny_policy`'s
    tokenizer over a 2-layer Llama of hidden size :data:`QUICK_LOOK_HIDDEN_SIZE` (~0.4M parameters), saved as
    is, servable by vLLM's CPU backend. (:func:`tiny_policy`, narrower, is what the tests pin.)"""
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=seed, hidden_size=QUICK_LOOK_HIDDEN_SIZE)
    model.config.envace_built_in_process = "tiny"  # the model card says so (integrations.trl.model_card)
    return TransformersPolicy(model, tokenizer)
