"""Model cards that name the model a run started from.

TRL's trainers write a model card (``README.md``) into ``output_dir`` and name the base model only when
``config._name_or_path`` is a hub id: a model loaded from a local folder (the embedded default's cache, an
earlier run's ``final/``) comes out as "a fine-tuned version of [None]". :class:`BaseModelCardMixin` names
it instead, found from the folder: the embedded default is SmolLM2-135M-Instruct's hub id, and a folder with
a card of its own passes on that card's base model (so SFT → GRPO still names the model both started from).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEFAULT_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def base_model_name(name_or_path: str | None) -> str | None:
    """What a model card should call the model loaded from ``name_or_path`` (``None``: unknown)."""
    if not name_or_path:
        return None
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        return name_or_path  # a hub id
    from ..policy.default_model import default_model_dir

    if path.resolve() == default_model_dir().resolve():
        return DEFAULT_MODEL_HUB_ID
    if (path / "README.md").is_file():
        from huggingface_hub import ModelCard

        base = ModelCard.load(path / "README.md").data.base_model
        if isinstance(base, list):
            base = base[0] if base else None
        return base if isinstance(base, str) and not Path(base).is_dir() else None
    return None


class BaseModelCardMixin:
    """For a TRL trainer: the model card names the base model even when it was loaded from a local folder."""

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        config = self.model.config  # type: ignore[attr-defined]
        loaded_from = getattr(config, "_name_or_path", "")
        named = base_model_name(loaded_from)
        if named is None or named == loaded_from:
            return super().create_model_card(*args, **kwargs)  # type: ignore[misc]
        # TRL reads the name from the config; lend it the resolved one while it writes the card.
        config._name_or_path = named
        try:
            return super().create_model_card(*args, **kwargs)  # type: ignore[misc]
        finally:
            config._name_or_path = loaded_from
