"""BFCL multi-turn: its executable Python backends as the real executor, and its turn-by-turn rules as reward.

The backends (file system, Twitter, trading, travel, vehicle, ...) are plain classes whose public methods are the
tools. BFCL's own harness runs calls by rewriting call strings and ``eval``-ing them; here calls are dispatched by
name through a table of the involved instances' public methods, with the arguments as keyword arguments, and the
ground truth's call strings are *parsed* (``ast``), never evaluated.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envace_gym.errors import DomainError
from envace_gym.tools import ToolCall, ToolExecutor

BACKEND = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
CLASSES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS = {"MathAPI"}


def _load_instances(initial_config: Mapping[str, Any], classes: Iterable[str]) -> dict[str, Any]:
    instances = {}
    for name in classes:
        if name not in CLASSES:
            raise DomainError(f"BFCL class {name} is not a multi-turn backend")
        try:
            module = importlib.import_module(f"{BACKEND}.{CLASSES[name]}")
        except ImportError as exc:  # MathAPI needs mpmath
            raise DomainError(f"BFCL backend {name} cannot be imported ({exc}); run `make benchmarks`") from exc
        instance = getattr(module, name)()
        if name not in STATELESS:
            instance._load_scenario(copy.deepcopy(dict(initial_config.get(name, {}))))
        instances[name] = instance
    return instances


def _result_text(result: Any) -> str:
    """A result as BFCL's harness records it (strings kept, dicts as JSON, anything else ``str``)."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class BFCLBackends(ToolExecutor):
    """The involved BFCL backend instances of one task, as a real executor."""

    def __init__(self, initial_config: Mapping[str, Any], classes: Sequence[str]) -> None:
        super().__init__({})
        self.instances = _load_instances(initial_config, classes)
        self.methods = {
            name: getattr(instance, name)
            for instance in self.instances.values()
            for name, _ in inspect.getmembers(type(instance), inspect.isfunction)
            if not name.startswith("_")
        }

    def execute(self, call: ToolCall) -> Any:
        method = self.methods.get(call.name)
        if method is None:
            raise KeyError(f"no BFCL backend method {call.name!r}")
        self.calls_executed += 1
        try:  # a copy: backends keep argument lists in their state and mutate them later
            result = method(**copy.deepcopy(dict(call.arguments)))
        except Exception as exc:  # BFCL reports a failing call as its result
            return f"Error during execution: {exc}"
        return json.loads(json.dumps(result, default=str)) if isinstance(result, (dict, list)) else result

    def run_text(self, call: ToolCall) -> str:
        """Execute and return the result as BFCL records it (for its response check)."""
        return _result_text(self.execute(call))

    def snapshot(self) -> dict[str, Any]:
        return {
            name: {k: v for k, v in vars(obj).items() if not k.startswith("_")} for name, obj in self.instances.items()
        }


def parse_call(text: str, backends: BFCLBackends) -> ToolCall:
    """A ground-truth call string (``cd(folder='x')``, ``sort('a.txt')``) as a ToolCall, positional arguments
    bound to their parameter names from the backend method's signature. Parsed, never evaluated."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise DomainError(f"not a plain call: {text!r}")
    name = node.func.id
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    method = backends.methods.get(name)
    if method is None:
        raise DomainError(f"unknown BFCL method in ground truth: {name}")
    bound = inspect.signature(method).bind_partial(*args, **kwargs)
    return ToolCall(name, dict(bound.arguments))


def gold_turns(entry: Mapping[str, Any], answer: Sequence[Sequence[str]]) -> list[list[ToolCall]]:
    backends = BFCLBackends(entry.get("initial_config", {}), entry["involved_classes"])
    return [[parse_call(c, backends) for c in turn] for turn in answer]


def score_turns(
    entry: Mapping[str, Any], gold: Sequence[Sequence[ToolCall]], made: Sequence[Sequence[ToolCall]]
) -> tuple[bool, str]:
    """BFCL's multi-turn rules: after each user turn, the model's backends must be in the same state as the gold
    ones, and every gold result of the turn must be among the model's results so far."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

    classes, config = entry["involved_classes"], entry.get("initial_config", {})
    model, truth = BFCLBackends(config, classes), BFCLBackends(config, classes)
    results_so_far: list[str] = []
    for index, gold_calls in enumerate(gold):
        calls = list(made[index]) if index < len(made) else []
        results_so_far += [model.run_text(c) for c in calls]
        gold_results = [truth.run_text(c) for c in gold_calls]
        if gold_calls and not calls:
            return False, f"turn {index + 1}: no call where the ground truth makes {len(gold_calls)}"
        if not gold_calls:
            continue
        verdict = state_checker(model.instances, truth.instances)
        if not verdict["valid"]:
            return False, f"turn {index + 1}: {verdict['error_message']}"
        verdict = response_checker(results_so_far, gold_results, index)
        if not verdict["valid"]:
            return False, f"turn {index + 1}: {verdict['error_message']}"
    return True, "ok"
