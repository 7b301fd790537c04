"""Text spaces for chat environments.

Gymnasium's :class:`~gymnasium.spaces.Text` admits only the characters of its charset. A model can
write any Unicode, so :class:`AnyText` admits every string up to ``max_length`` and uses its charset only
to *sample*. :class:`ActText`, the action space, samples Act turns shaped like tool calls (mostly
malformed ones) so that ``action_space.sample()`` exercises the environment's error paths rather than
producing harmless prose.
"""

from __future__ import annotations

import json
import string
from typing import Any

from gymnasium import spaces

# Sampling charset: printable ASCII (JSON, prose, code) plus a few letters outside it.
SAMPLE_CHARSET = string.printable + "éüßçñ中文日本語кириллицаαβγ€£→✓😀"


class AnyText(spaces.Text):
    """A :class:`gymnasium.spaces.Text` that contains any ``str`` of at most ``max_length`` characters."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.min_length}, {self.max_length}, charset=<any unicode>)"

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and (other.min_length, other.max_length) == (self.min_length, self.max_length)


class ActText(AnyText):
    """The Act turn: any text. Samples are random ``<tool_call>`` blocks (random JSON-ish bodies,
    sometimes naming one of ``tool_names``) with random prose around them."""

    def __init__(self, max_length: int, tool_names: tuple[str, ...] = (), *, seed: int | None = None) -> None:
        super().__init__(max_length, seed=seed)
        self.tool_names = tuple(tool_names)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        rng = self.np_random
        budget = min(self.max_length, 400)

        def noise(n: int) -> str:
            return "".join(rng.choice(self.character_list, size=int(rng.integers(0, n + 1))))

        kind = int(rng.integers(4))
        if kind == 0:  # random bytes inside the tags
            body = noise(budget // 4)
        elif kind == 1:  # a call object with a random name and random argument values
            name = str(rng.choice(self.tool_names)) if self.tool_names and rng.random() < 0.7 else noise(12)
            args = {noise(8): noise(8) for _ in range(int(rng.integers(0, 4)))}
            body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
        elif kind == 2:  # truncated JSON
            body = json.dumps({"name": noise(10), "arguments": {"x": int(rng.integers(-1e9, 1e9))}})
            body = body[: int(rng.integers(1, len(body)))]
        else:  # a list holding a non-object
            body = json.dumps([noise(6), int(rng.integers(100))], ensure_ascii=False)
        text = f"{noise(budget // 8)}<tool_call>\n{body}\n</tool_call>{noise(budget // 8)}"
        return text[: self.max_length]
