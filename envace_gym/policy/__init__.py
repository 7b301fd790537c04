"""The policy: one model that writes both the Act turns and the rehearsed tool responses.

:class:`Policy` is the small protocol the environment needs (:mod:`.protocol`, no torch): batched
generation from token ids, returning completion ids and per-token log-probabilities.
:class:`TransformersPolicy` implements it over any causal LM from ``transformers`` (:mod:`.transformers`,
with KV reuse across turns in :mod:`.sessions`), :class:`VLLMPolicy` over a vLLM engine (:mod:`.vllm`, the
optional ``vllm`` extra), :class:`VLLMServerPolicy` over vLLM servers (:mod:`.vllm_server`); :func:`make_policy` builds one from whatever a user passes
(:mod:`.factory`: ``None`` for the embedded default of :mod:`.default_model`, ``"tiny"`` for :mod:`.tiny`,
a path or hub id, a ``(model, tokenizer)`` pair, or a Policy).

The torch-free names import eagerly; the rest load on first use, so the stages before the policy
(tools, parsing, domains) can name :class:`SamplingParams` without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .protocol import Generation, Policy, SamplingParams
from .tokens import END_OF_TURN_TOKENS, stop_token_ids

__getattr__ = lazy_exports(
    __name__,
    {
        "TransformersPolicy": ".transformers",
        "VLLMPolicy": ".vllm",
        "VLLMServerPolicy": ".vllm_server",
        "check_model_source": ".transformers",
        "GenerationSession": ".sessions",
        "make_policy": ".factory",
    },
)

if TYPE_CHECKING:
    from .factory import make_policy
    from .sessions import GenerationSession
    from .transformers import TransformersPolicy, check_model_source
    from .vllm import VLLMPolicy
    from .vllm_server import VLLMServerPolicy


__all__ = [
    "END_OF_TURN_TOKENS",
    "Generation",
    "GenerationSession",
    "Policy",
    "SamplingParams",
    "TransformersPolicy",
    "VLLMPolicy",
    "VLLMServerPolicy",
    "check_model_source",
    "make_policy",
    "stop_token_ids",
]
