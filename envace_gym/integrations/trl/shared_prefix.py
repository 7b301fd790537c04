"""The shared-prefix forward inside TRL's loss: rows that share a prompt prefix encode it once, with the same
values and gradients as TRL's per-row forward (:mod:`envace_gym.training.packing`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...training.packing import DEFAULT_PACK_TOKENS, completion_scores, packing_support, unwrap


class SharedPrefixMixin:
    """For a ``GRPOTrainer`` subclass: per-token log-probabilities (current policy, "old" and reference
    passes alike) from the shared-prefix forward of :mod:`envace_gym.training.packing` instead of one padded batch.

    The rows of each call are packed into prefix trees of at most ``args.pack_tokens`` positions (default
    4096); a call with several packs recomputes each in the backward pass, so memory holds one pack's
    activations. Vision inputs, MoE auxiliary losses, ``args.shared_prefix=False`` and models whose attention
    cannot take the mask (logged once) go through TRL's own forward.
    """

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **extra: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        rows = _unpadded(input_ids, attention_mask, logits_to_keep)
        plain = (
            not getattr(self.args, "shared_prefix", True)
            or compute_aux_loss
            or any(v is not None for v in extra.values())
            or rows is None
            or packing_support(unwrap(model)) is not None
        )
        if plain:
            return super()._get_per_token_logps_and_entropies(  # type: ignore[misc]
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **extra,
            )  # fmt: skip
        prompts, completions = rows
        with self.accelerator.autocast():  # type: ignore[attr-defined]
            scores = completion_scores(
                model, prompts, completions, self.temperature,  # type: ignore[attr-defined]
                budget=getattr(self.args, "pack_tokens", DEFAULT_PACK_TOKENS),
            )  # fmt: skip
        logps = _grid(scores.logprobs, logits_to_keep, input_ids.device)
        entropies = _grid(scores.entropies, logits_to_keep, input_ids.device) if compute_entropy else None
        return logps, entropies, None


def _unpadded(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int
) -> tuple[list[list[int]], list[list[int]]] | None:
    """Each row's (prompt, completion) ids from TRL's layout (left-padded prompts, right-padded completions);
    ``None`` when a completion's mask is not one run from its start (TRL's forward then handles it)."""
    prompts, completions = [], []
    width = input_ids.shape[1] - logits_to_keep
    for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
        n = sum(mask[width:])
        if any(mask[width + n :]) or (n and not all(mask[width : width + n])):
            return None
        prompts.append([t for t, m in zip(ids[:width], mask[:width], strict=True) if m])
        completions.append(ids[width : width + n])
    return prompts, completions


def _grid(values: Sequence[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    """Per-row tensors, left-aligned into one ``(rows, width)`` tensor (zeros after each row's end)."""
    rows = [v if len(v) == width else torch.cat([v, v.new_zeros(width - len(v))]) for v in values]
    return torch.stack(rows).to(device) if rows else torch.zeros((0, width), device=device)

