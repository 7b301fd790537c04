"""BFCL's single-turn (AST) rules, written for envace-gym: does a list of calls match the possible answers?

Consistent with ``bfcl_eval``'s ``ast_checker`` for Python-language categories (a test cross-checks the two on a
sample of entries):

* ``parallel`` categories: as many calls as expected, each expected call matched by a distinct call, any order;
* ``multiple`` categories and the rest: exactly one call, checked against the one expected call;
* a call matches when the name is right, every ``required`` parameter is given, every given parameter is in the
  function doc *and* in the possible answer, each value has the doc's type (an int passes for a float; ``any``
  means a string; one level of ``items`` type is checked) and is among the allowed values (strings compared
  case- and punctuation-insensitively, dicts and lists of dicts key by key), and every parameter of the possible
  answer not marked optional (``""`` among its values) is given. A value of the answer's own type where the doc
  says otherwise is a "variable" and is compared as is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
_PUNCTUATION = re.compile(r"[ ,./\-_*^]")


def standardize(text: str) -> str:
    """BFCL's string normalisation: no spaces or ``,./-_*^``, lower case, single quotes as double."""
    return _PUNCTUATION.sub("", text).lower().replace("'", '"')


def _norm(value: Any) -> Any:
    return standardize(value) if isinstance(value, str) else value


def check_calls(
    functions: Sequence[Mapping[str, Any]],
    calls: Sequence[tuple[str, Mapping[str, Any]]],
    ground_truth: Sequence[Mapping[str, Mapping[str, list]]],
    category: str,
) -> tuple[bool, str]:
    """``(valid, reason)`` for the ``calls`` (name, arguments) made against an entry's possible answers."""
    docs = {f["name"]: f for f in functions}
    if len(calls) != len(ground_truth):
        return False, f"wrong number of calls: {len(calls)} for {len(ground_truth)} expected"
    if "parallel" not in category:
        expected = ground_truth[0]
        doc = docs.get(next(iter(expected))) if "multiple" in category else functions[0]
        return _check_one(doc, calls[0], expected)
    used: set[int] = set()
    for expected in ground_truth:
        doc = docs.get(next(iter(expected)))
        match = next((i for i, c in enumerate(calls) if i not in used and _check_one(doc, c, expected)[0]), None)
        if match is None:
            return False, f"no call matches {next(iter(expected))}"
        used.add(match)
    return True, "ok"


def _check_one(
    doc: Mapping[str, Any] | None, call: tuple[str, Mapping[str, Any]], expected: Mapping[str, Any]
) -> tuple[bool, str]:
    name, allowed = next(iter(expected.items()))
    if doc is None:
        return False, f"no function doc for {name}"
    called, arguments = call
    if called != name:
        return False, f"wrong function {called!r}, expected {name!r}"
    schema = doc.get("parameters") or {}
    properties = schema.get("properties") or {}
    for param in schema.get("required") or []:
        if param not in arguments:
            return False, f"missing required parameter {param!r}"
    for param, value in arguments.items():
        if param not in properties or param not in allowed:
            return False, f"unexpected parameter {param!r}"
        ok, reason = _check_value(param, value, properties[param], allowed[param])
        if not ok:
            return False, reason
    for param, values in allowed.items():
        if param not in arguments and "" not in values:
            return False, f"parameter {param!r} missing and not optional"
    return True, "ok"


def _answer_type(values: Sequence[Any]) -> type | None:
    return next((type(v) for v in values if v != ""), None)


def _check_value(param: str, value: Any, spec: Mapping[str, Any], allowed: Sequence[Any]) -> tuple[bool, str]:
    kind = spec.get("type", "any")
    expected = PYTHON_TYPES.get(kind, str)
    inner = PYTHON_TYPES.get((spec.get("items") or {}).get("type", "any"), str) if kind in ("array", "tuple") else None
    if kind == "float" and type(value) is int:
        value = float(value)  # an int passes for a float
    answer_type = _answer_type(allowed)
    variable = answer_type is not None and answer_type is not expected
    typed = type(value) is expected and (inner is None or _inner_types_ok(value, allowed, inner))
    if not typed:  # a value of the answer's own type is a "variable": compared as is
        if answer_type is None or type(value) is not answer_type:
            return False, f"{param!r}: expected {kind}, got {type(value).__name__}"
        variable = True
    if not variable:
        if expected is dict:
            return _dict_in(param, value, allowed)
        if expected is list and inner is dict:
            return _dict_list_in(param, value, allowed)
        if expected is str:
            ok = standardize(value) in [standardize(a) for a in allowed if isinstance(a, str)]
            return ok, "ok" if ok else f"{param!r}: {value!r} is not an allowed value"
        if expected is list:
            ok = [_norm(v) for v in value] in [[_norm(x) for x in a] for a in allowed if isinstance(a, list)]
            return ok, "ok" if ok else f"{param!r}: {value!r} is not an allowed list"
    ok = value in allowed
    return ok, "ok" if ok else f"{param!r}: {value!r} is not an allowed value"


def _inner_types_ok(value: list, allowed: Sequence[Any], inner: type) -> bool:
    """One level of item types, checked against any list among the allowed values (BFCL's rule)."""
    for candidate in allowed:
        if not isinstance(candidate, list):
            return True  # an allowed value that is not a list leaves the items unchecked
        if all(_item_type_ok(v, candidate, inner) for v in value):
            return True
    return False


def _item_type_ok(value: Any, allowed: Sequence[Any], inner: type) -> bool:
    answer_type = _answer_type(allowed)  # no int-for-float allowance one level down, as in BFCL
    return type(value) is inner or (answer_type is not None and type(value) is answer_type)


def _dict_in(param: str, value: Mapping[str, Any], allowed: Sequence[Any]) -> tuple[bool, str]:
    for candidate in allowed:
        if candidate == "" or not isinstance(candidate, Mapping):
            continue
        if all(k in candidate and _norm(v) in [_norm(x) for x in candidate[k]] for k, v in value.items()) and all(
            k in value or "" in vs for k, vs in candidate.items()
        ):
            return True, "ok"
    return False, f"{param!r}: {value!r} matches no allowed dict"


def _dict_list_in(param: str, value: list, allowed: Sequence[Any]) -> tuple[bool, str]:
    for candidate in allowed:
        if isinstance(candidate, list) and len(candidate) == len(value):
            if all(_dict_in(param, v, [c])[0] for v, c in zip(value, candidate, strict=True)):
                return True, "ok"
    return False, f"{param!r}: {value!r} matches no allowed list of dicts"
