"""The policy protocol: what the environment needs from a generator, without torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch.

    Attributes:
        max_new_tokens: Most tokens to generate per prompt.
        temperature: Sampling temperature; ``0`` means greedy decoding.
        top_p: Nucleus sampling mass (``1.0`` disables it).
        top_k: Keep the ``k`` most likely tokens (``0`` disables it).
        seed: Seeds the sampler for this batch, making it reproducible; ``None`` uses torch's global RNG.
        stop: Strings that end a completion (kept, as the last tokens), besides the end-of-turn token.
        min_new_tokens: Tokens to generate before an end-of-turn token may end the completion (the
            recorded log-probs then exclude the end tokens, which were masked: meant for benchmarks).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    min_new_tokens: int = 0

    def with_seed(self, seed: int | None) -> SamplingParams:
        return replace(self, seed=seed)


@dataclass(frozen=True)
class Generation:
    """One completion.

    ``logprobs[i]`` is the log-probability of ``completion_ids[i]`` under the policy at the sampling
    temperature (``log_softmax(logits / T)``, the quantity a PPO-style trainer recomputes; top-p/top-k
    truncation is not folded in). ``finish_reason`` is ``"stop"`` when an end-of-turn token was
    produced (it is kept as the last id) and ``"length"`` when ``max_new_tokens`` ran out.
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: Literal["stop", "length"]


@runtime_checkable
class Policy(Protocol):
    """What the environment needs from a model.

    Attributes:
        tokenizer: Renders chats (its chat template must accept ``tools=``) and decodes completions.
        max_context: Longest prompt + completion, in tokens, the model accepts.
    """

    tokenizer: PreTrainedTokenizerBase
    max_context: int

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One completion per prompt, in order."""
        ...
