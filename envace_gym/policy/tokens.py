"""End-of-turn tokens: what ends an Act or Rehearse turn, for every chat family envace-gym knows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


# End-of-turn tokens of the chat families envace-gym knows (ChatML, Llama 3, gpt-oss, GLM, DeepSeek), used
# as stop tokens wherever the tokenizer holds them as special tokens.
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|return|>", "<|call|>", "<|observation|>", "<|user|>",
    "<｜end▁of▁sentence｜>",
)  # fmt: skip


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, model: Any = None) -> list[int]:
    """End-of-turn ids: the tokenizer's EOS, the known end-of-turn special tokens it holds
    (:data:`END_OF_TURN_TOKENS`), and the model's own EOS ids."""
    ids: list[int] = []
    specials = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    specials |= set(tokenizer.all_special_tokens)
    candidates: list[Any] = [tokenizer.eos_token_id]
    candidates += [tokenizer.convert_tokens_to_ids(t) for t in END_OF_TURN_TOKENS if t in specials]
    if model is not None and getattr(model, "generation_config", None) is not None:
        eos = model.generation_config.eos_token_id
        candidates += eos if isinstance(eos, list) else [eos]
    for tid in candidates:
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id and tid not in ids:
            ids.append(tid)
    return ids
