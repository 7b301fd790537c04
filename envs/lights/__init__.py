"""``lights``: one request, one call, one fact to report — a domain small enough to study learning on a CPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from envace_gym.domains import GeneratedDomain, ReferenceRecorder, Task
from envace_gym.domains.task import stable_hash
from envace_gym.tools import ToolExecutor, ToolFailure, tool

ROOMS = ("kitchen", "bedroom", "hall", "office", "garage", "attic", "porch", "studio")
COLORS = ("red", "green", "blue", "white", "yellow", "orange", "purple", "pink")

# variant: (rooms, colors, report_id, favorite). "easy": two rooms, two colors, the answer names the color only.
# "favorite": one room, and the user asks for "my usual color" (red), which only the reward reveals: what the
# learning test trains, since a from-scratch model learns it without reading the request.
VARIANTS: dict[str | None, tuple[int, int, bool, str | None]] = {
    None: (len(ROOMS), len(COLORS), True, None),
    "easy": (2, 2, False, None),
    "favorite": (1, 2, False, "red"),
}

_REQUESTS = (
    "Set the {room} lamp to {color}.",
    "Please make the light in the {room} {color}.",
    "I want {color} light in the {room}.",
)
_FAVORITE_REQUESTS = (
    "Set the {room} lamp to my usual color.",
    "Please make the light in the {room} my usual color.",
    "I want my usual light in the {room}.",
)


class LightsTools(ToolExecutor):
    """The real executor of ``lights``: a house whose lamps have ids the agent cannot guess."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        super().__init__(state)
        self.state.setdefault("lamps", {})
        self.state.setdefault("colors", {})

    @tool
    def set_lamp(self, room: str, color: str) -> dict:
        """Set the color of the lamp in a room.

        Args:
            room: The room whose lamp to set, as the user names it.
            color: The new color, a plain color name.

        Returns:
            The lamp's id, its room and its new color.
        """
        lamp = self.state["lamps"].get(room)
        if lamp is None:
            raise ToolFailure(f"there is no lamp in the {room}")
        if color not in COLORS:
            raise ToolFailure(f"the lamps cannot show {color!r}; they show {', '.join(COLORS)}")
        self.state["colors"][room] = color
        return {"lamp_id": lamp, "room": room, "color": color}


class LightsDomain(GeneratedDomain):
    """
    ## Description

    The smallest complete EnvACE loop that still needs the tool's answer: the user asks for a color in a
    room; the agent calls ``set_lamp`` with both, then tells the user the lamp's id, which only the tool's
    result holds (every task's house numbers its lamps afresh). It is sized for learning studies on a CPU: the
    small scale of ``envace experiment`` trains a from-scratch model of a few hundred thousand parameters on
    its easy variant (docs/results.md has what that model did and did not learn).

    ## Tools

    ``set_lamp(room, color)``, both strings (the schema lists no rooms or colors: which rooms exist is the
    house's business, and the words the user said are the only ones in the prompt); it returns
    ``{"lamp_id": "L-<nn>", "room": ..., "color": ...}``, or an error for a room without a lamp or a color the
    lamps cannot show.

    ## Tasks

    Drawn from a seeded generator: room, color, one of three phrasings and the house's lamp ids. A task is in
    ``test`` when a hash of its (room, color) pair says so (20%), so held-out tasks ask for pairs that no
    training task asks for. Defaults: 1000 train, 200 test.

    ## Reward

    Checklist: ``calls`` (``set_lamp`` with the requested room and color was made; weight 2) and
    ``answer_contains`` (the final answer names the lamp id and the color; weight 1), so an answer written
    without the call earns a third at most. Scored without running any tool: the expected values are recorded
    when the task is built.

    ## Episode End

    The final answer; at most 3 Act turns (the ``max_turns`` of its spec, ``lights-v0``).

    ## Arguments

    ``make_domain("lights-v0", num_tasks={"train": 1000, "test": 200}, seed=0)``. ``make_domain("lights:easy-v0")``
    is the variant a from-scratch model is given: two rooms and two colors (held-out tasks then differ in
    phrasing and lamp ids, not in the pair asked for) and an answer that names the color only.
    ``make_domain("lights:favorite-v0")`` is the learning test's (``envace_gym.recipes.learning``): one room, and
    the user asks for "my usual color" without naming it; the reference uses the household's favorite (red),
    so only the reward can teach it. ``rooms``, ``colors``, ``report_id`` and ``favorite`` set the same by
    hand (``favorite="green"`` is another household, with the same requests).
    """

    name = "lights"
    description = "Set a lamp's color, then report its id: one call, one fact from the result."
    system_prompt = "You control the lamps of a house. Call set_lamp, then tell the user the lamp id and its color."
    executor_class = LightsTools

    def __init__(
        self,
        variant: str | None = None,
        *,
        num_tasks: Mapping[str, int] | None = None,
        seed: int | None = None,
        rooms: int = len(ROOMS),
        colors: int = len(COLORS),
        report_id: bool = True,
        favorite: str | None = None,
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown lights variant {variant!r}; choose from {sorted(v for v in VARIANTS if v)}")
        if variant is not None:
            self.name = f"lights:{variant}"
            rooms, colors, report_id, favorite = VARIANTS[variant]
        if not (1 <= rooms <= len(ROOMS) and 1 <= colors <= len(COLORS)):
            raise ValueError(f"rooms must be in 1..{len(ROOMS)} and colors in 1..{len(COLORS)}")
        if favorite is not None and favorite not in COLORS:
            raise ValueError(f"favorite must be one of {', '.join(COLORS)}, got {favorite!r}")
        self.rooms, self.colors, self.report_id = ROOMS[:rooms], COLORS[:colors], report_id
        self.favorite = favorite
        super().__init__(num_tasks, seed)

    def sample_params(self, rng: np.random.Generator) -> dict[str, Any]:
        ids = rng.choice(90, size=len(ROOMS), replace=False) + 10
        return {
            "room": str(rng.choice(self.rooms)),
            "color": self.favorite or str(rng.choice(self.colors)),
            "template": int(rng.integers(len(_REQUESTS))),
            "lamps": {room: f"L-{int(i)}" for room, i in zip(ROOMS, ids, strict=True)},
        }

    def task_key(self, params: dict[str, Any]) -> str:
        return f"{params['room']}:{params['color']}:{params['template']}:{','.join(params['lamps'].values())}"

    def split_of(self, key: str) -> str:
        # Held-out tasks ask for (room, color) pairs no training task asks for, when there are enough pairs to
        # hold some out; with a handful, they differ in phrasing and lamp ids.
        pair = ":".join(key.split(":")[:2]) if len(self.rooms) * len(self.colors) >= 16 else key
        return "test" if stable_hash(f"{self.name}:{pair}") % 1000 < self.test_fraction * 1000 else "train"

    def build_task(self, params: dict[str, Any], task_id: str, split: str) -> Task:
        room, color = params["room"], params["color"]
        requests = _FAVORITE_REQUESTS if self.favorite else _REQUESTS
        state = {"lamps": dict(params["lamps"]), "colors": {}}
        rec = ReferenceRecorder(LightsTools(state))
        result = rec.call("set_lamp", room=room, color=color)
        rec.answer(f"Lamp {result['lamp_id']} is now {color}.")
        (call,) = rec.turns[0].calls
        return Task(
            id=task_id,
            domain=self.name,
            prompt=requests[params["template"]].format(room=room, color=color),
            split=split,
            tools=("set_lamp",),
            reference=rec.turns,
            initial_state={"lamps": dict(params["lamps"]), "colors": {}},
            expected={
                "calls": [call.to_json()],
                "answer_contains": [result["lamp_id"], color] if self.report_id else [color],
                "weights": {"calls": 2.0, "answer_contains": 1.0},  # answering without the call earns little
            },
        )
