"""``units``: one question, one tool call, one number."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from envace_gym.domains import GeneratedDomain, ReferenceRecorder, Task
from envace_gym.tools import ToolExecutor, ToolFailure, tool

# Factors to the base unit of each kind (metre, kilogram).
LENGTH = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048, "yd": 0.9144, "mi": 1609.344}
MASS = {"mg": 1e-6, "g": 0.001, "kg": 1.0, "t": 1000.0, "oz": 0.028349523125, "lb": 0.45359237}
TEMPERATURE = ("C", "F", "K")
NAMES = {
    "mm": "millimeters", "cm": "centimeters", "m": "meters", "km": "kilometers", "in": "inches", "ft": "feet",
    "yd": "yards", "mi": "miles", "mg": "milligrams", "g": "grams", "kg": "kilograms", "t": "metric tons",
    "oz": "ounces", "lb": "pounds", "C": "degrees Celsius", "F": "degrees Fahrenheit", "K": "kelvins",
}  # fmt: skip

LengthUnit = Literal["mm", "cm", "m", "km", "in", "ft", "yd", "mi"]
MassUnit = Literal["mg", "g", "kg", "t", "oz", "lb"]
TemperatureUnit = Literal["C", "F", "K"]


def _to_kelvin(value: float, unit: str) -> float:
    return {"C": value + 273.15, "F": (value - 32) * 5 / 9 + 273.15, "K": value}[unit]


def _from_kelvin(value: float, unit: str) -> float:
    return {"C": value - 273.15, "F": (value - 273.15) * 9 / 5 + 32, "K": value}[unit]


class UnitsTools(ToolExecutor):
    """Stateless converters: the real executor of ``units``."""

    @tool
    def convert_length(self, value: float, from_unit: LengthUnit, to_unit: LengthUnit) -> dict:
        """Convert a length from one unit to another.

        Args:
            value: The length to convert.
            from_unit: The unit of `value`.
            to_unit: The unit to convert to.

        Returns:
            The converted value (rounded to 4 decimals) and its unit.
        """
        return {"value": round(value * LENGTH[from_unit] / LENGTH[to_unit], 4), "unit": to_unit}

    @tool
    def convert_mass(self, value: float, from_unit: MassUnit, to_unit: MassUnit) -> dict:
        """Convert a mass from one unit to another.

        Args:
            value: The mass to convert.
            from_unit: The unit of `value`.
            to_unit: The unit to convert to.

        Returns:
            The converted value (rounded to 4 decimals) and its unit.
        """
        return {"value": round(value * MASS[from_unit] / MASS[to_unit], 4), "unit": to_unit}

    @tool
    def convert_temperature(self, value: float, from_unit: TemperatureUnit, to_unit: TemperatureUnit) -> dict:
        """Convert a temperature between Celsius (C), Fahrenheit (F) and Kelvin (K).

        Args:
            value: The temperature to convert.
            from_unit: The scale of `value`.
            to_unit: The scale to convert to.

        Returns:
            The converted value (rounded to 4 decimals) and its unit.
        """
        kelvin = _to_kelvin(value, from_unit)
        if kelvin < 0:
            raise ToolFailure(f"{value} {from_unit} is below absolute zero")
        return {"value": round(_from_kelvin(kelvin, to_unit), 4), "unit": to_unit}


_QUESTIONS = (
    "How many {to} is {value} {frm}?",
    "Convert {value} {frm} to {to}.",
    "What is {value} {frm} in {to}?",
    "I have {value} {frm}. How much is that in {to}?",
)


class UnitsDomain(GeneratedDomain):
    """
    ## Description

    A single-call domain: the user asks for a unit conversion; the agent picks one of three converters
    (length, mass, temperature), calls it with the right enum units, and reports the number. It is the
    smallest complete EnvACE loop: one Act turn with a call, one rehearsed (or real) response, one answer.

    ## Tools

    ``convert_length``, ``convert_mass``, ``convert_temperature``: ``(value: number, from_unit, to_unit)``
    with ``from_unit``/``to_unit`` enums; each returns ``{"value": number, "unit": str}``. A temperature below
    absolute zero returns ``{"error": ...}``. Every task whitelists all three.

    ## Tasks

    Drawn from a seeded generator: kind, value (a "round" number such as 12.5 or 300) and two distinct
    units, phrased with one of four templates. A task is in ``test`` when a hash of its parameters says
    so (20%), so the splits never share a task. Defaults: 1000 train, 200 test.

    ## Reward

    Checklist, equal weights: ``calls`` (the reference call, canonical name and arguments, was made) and
    ``answer_numbers`` (the converted value, to 2 decimals, appears in the final answer).

    ## Episode End

    The final answer; at most 4 Act turns (the ``max_turns`` of its spec, ``units-v0``).

    ## Arguments

    ``make_domain("units-v0", num_tasks={"train": 1000, "test": 200}, seed=0)``.
    """

    name = "units"
    description = "Unit conversion: one tool call, one number."
    system_prompt = (
        "You are a unit conversion assistant. Call exactly one conversion tool with the user's value and units, "
        "then answer with the converted value rounded to 2 decimals and its unit."
    )
    executor_class = UnitsTools

    def sample_params(self, rng: np.random.Generator) -> dict[str, Any]:
        kind = str(rng.choice(["length", "mass", "temperature"]))
        units = list(LENGTH if kind == "length" else MASS if kind == "mass" else TEMPERATURE)
        frm, to = (str(u) for u in rng.choice(units, size=2, replace=False))
        if kind == "temperature":
            value = float(rng.integers(-40, 250)) if frm != "K" else float(rng.integers(200, 500))
        else:
            value = float(rng.choice([0.5, 1, 2, 2.5, 3, 5, 7.5, 10, 12, 12.5, 20, 25, 42, 50, 100, 250, 300, 1000]))
        template = int(rng.integers(len(_QUESTIONS)))
        return {"kind": kind, "value": value, "from_unit": frm, "to_unit": to, "template": template}

    def task_key(self, params: dict[str, Any]) -> str:
        return f"{params['kind']}:{params['value']}:{params['from_unit']}:{params['to_unit']}"

    def build_task(self, params: dict[str, Any], task_id: str, split: str) -> Task:
        value = params["value"]
        shown = int(value) if float(value).is_integer() else value
        frm, to = params["from_unit"], params["to_unit"]
        prompt = _QUESTIONS[params["template"]].format(value=shown, frm=NAMES[frm], to=NAMES[to])
        rec = ReferenceRecorder(UnitsTools())
        result = rec.call(f"convert_{params['kind']}", value=value, from_unit=frm, to_unit=to)
        rec.answer(f"{shown} {NAMES[frm]} is {result['value']:.2f} {NAMES[to]}.")
        (call,) = rec.turns[0].calls
        return Task(
            id=task_id,
            domain=self.name,
            prompt=prompt,
            split=split,
            tools=tuple(self.tools.names),
            reference=rec.turns,
            expected={"calls": [call.to_json()], "answer_numbers": [round(result["value"], 2)]},
        )
