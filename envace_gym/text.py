"""Untrusted text made safe to keep, tokenize and serialise: applied once, where text enters an episode.

Python strings may hold lone surrogates (``"\\ud800"``, also what JSON's ``"\\ud800"`` escape decodes to);
no tokenizer or UTF-8 writer accepts them. :func:`clean_text` replaces each with U+FFFD (a well-formed
surrogate *pair* becomes the character it encodes), so text that reaches the chat can always be
tokenized, and the messages and the token ids keep describing the same conversation.

:func:`shorten` writes a value in a bounded width, for what is printed or shown to a model as a summary.
"""

from __future__ import annotations

import json
from typing import Any

REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """``text`` with every code point UTF-8 cannot encode (lone surrogates) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        # Through UTF-16, a surrogate pair rejoins into its character and a lone one becomes U+FFFD.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_value(value: Any) -> Any:
    """A JSON value with :func:`clean_text` applied to every string in it, keys included."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: clean_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_value(v) for v in value]
    return value


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads` that refuses an object naming one key twice (the last
    value would silently win; a model that writes ``{"name": "a", "name": "b"}`` is confused, and its
    trainer should see that)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {clean_text(key)!r} in a JSON object")
        obj[key] = value
    return obj


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_loads(text: str) -> Any:
    """:func:`json.loads` for untrusted text: no ``NaN``/``Infinity``, no duplicate keys, strings cleaned.
    Raises ``ValueError`` (or ``RecursionError``) on anything else than strict JSON."""
    return clean_value(json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=unique_keys))


def shorten(value: Any, width: int, *, one_line: bool = False) -> str:
    """``value`` (a string, or any other value as JSON) in at most ``width`` characters, ending in "…" when cut.
    With ``one_line`` its newlines are written ``\\n`` first, so it prints on one line."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if one_line:
        text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


__all__ = ["REPLACEMENT", "clean_text", "clean_value", "shorten", "strict_loads", "unique_keys"]
