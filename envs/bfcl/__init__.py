"""``bfcl:<category>``: the Berkeley Function Calling Leaderboard (v4) as envace-gym domains."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from envace_gym.domains import (
    SPLITS,
    Domain,
    ReferenceTurn,
    RewardResult,
    Task,
    Trajectory,
    check_split,
    stable_hash,
)
from envace_gym.errors import DomainError
from envace_gym.tools import ToolCall, ToolExecutor, ToolRegistry

from .checker import check_calls
from .schemas import call_examples, from_bfcl, lenient, possible_answer_examples

INSTALL_HINT = "run `make benchmarks` (pip install --no-deps bfcl-eval==2026.3.23, plus mpmath)"
SINGLE_TURN = (
    "simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance", "live_relevance",
)  # fmt: skip
MULTI_TURN = ("multi_turn_base",)
OTHER_LANGUAGES = {"simple_java": "java", "simple_javascript": "javascript"}
IRRELEVANCE = ("irrelevance", "live_irrelevance")
# Gold answers that break their own function docs; BFCL's own checker refuses them too (docs/benchmarks.md).
REFUSED_BY_BFCL = {
    "parallel_multiple_12": "the gold answer passes 'permeability', which calculate_voltage_difference's doc lacks",
    "parallel_multiple_26": "the gold answer passes 'type', which bank.calculate_balance's doc lacks",
    "live_simple_106-63-0": "the gold answer leaves out record's required 'auto_loan_payment_start'",
    "live_simple_112-68-0": "the gold answer leaves out record's required 'acc_routing_start'",
    "live_multiple_507-149-4": "the gold answer leaves out Flights_4_SearchOnewayFlight's required 'origin_airport'",
    "live_multiple_862-181-3": "the gold answer passes 'journey_start_time', which Trains_1_FindTrains's doc lacks",
    "live_multiple_964-207-0": "the gold answer leaves out transfer_to_human_agent's required 'statement'",
}
SYSTEM_PROMPT = (
    "You are an assistant with access to functions. When a request needs them, call them with exactly the "
    "arguments the request gives; when it does not, answer without calling anything."
)
MULTI_TURN_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json", "MathAPI": "math_api.json", "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json", "TicketAPI": "ticket_api.json", "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json", "VehicleControlAPI": "vehicle_control.json",
}  # fmt: skip


def data_dir() -> Path:
    """``bfcl_eval``'s data folder, found without importing the package (its imports are heavy)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DomainError(f"the BFCL data is not installed; {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """BFCL's ``.json`` files are JSON Lines."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _concrete(allowed: Any) -> Any:
    """One concrete value from a possible answer. A dict answer (or each dict of a list of dicts) holds a list of
    allowed values per key, one level deep, as BFCL's checker reads it."""

    def first(d: dict) -> dict:
        return {
            k: next(x for x in vs if x != "")
            for k, vs in d.items()
            if isinstance(vs, list) and any(x != "" for x in vs)
        }

    if isinstance(allowed, dict):
        return first(allowed)
    if isinstance(allowed, list) and allowed and all(isinstance(x, dict) for x in allowed):
        return [first(x) for x in allowed]
    return allowed


_OMITTED = object()


def _first_allowed(params: dict[str, list]) -> dict[str, Any]:
    """Each parameter's first non-empty allowed value (``""`` marks a parameter that may be left out)."""
    out = {}
    for key, allowed in params.items():
        first = next((x for x in allowed or () if not (isinstance(x, str) and x == "")), _OMITTED)
        if first is not _OMITTED:
            out[key] = first
    return out


def categories() -> list[str]:
    """Every question category shipped (scored ones; the format-sensitivity index is not a category)."""
    return sorted(
        p.stem.removeprefix("BFCL_v4_") for p in data_dir().glob("BFCL_v4_*.json") if "format_sensitivity" not in p.name
    )


def multi_turn_docs(classes: Sequence[str]) -> list[dict[str, Any]]:
    folder = data_dir() / "multi_turn_func_doc"
    return [doc for name in classes for doc in read_jsonl(folder / MULTI_TURN_FILES[name])]


def iter_function_docs() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every function doc of every category and every multi-turn/agentic API: ``(where, language, doc)``."""
    for category in categories():
        language = OTHER_LANGUAGES.get(category, "python")
        for entry in read_jsonl(data_dir() / f"BFCL_v4_{category}.json"):
            for doc in entry.get("function", []):
                yield f"{category}/{entry['id']}", language, doc
    for path in sorted((data_dir() / "multi_turn_func_doc").glob("*.json")):
        for doc in read_jsonl(path):
            yield f"multi_turn_func_doc/{path.name}", "python", doc


class CallsOnly(ToolExecutor):
    """The "real" executor of single-turn BFCL, whose questions are judged on the calls alone: it records that a
    call arrived and executes nothing (BFCL has no backend for these categories)."""

    def execute(self, call: ToolCall) -> Any:
        self.calls_executed += 1
        return {"status": "received", "note": "this benchmark judges the call itself; nothing was executed"}


class BFCLDomain(Domain):
    """
    ## Description

    One BFCL v4 category as a domain: single-turn categories (``simple_python``, ``multiple``, ``parallel``,
    ``parallel_multiple``, ``irrelevance``, ``live_*``) and ``multi_turn_base``. Each entry brings its own
    function docs (so each task has its own tool registry); BFCL's ``dict``/``float``/``tuple``/``any`` types are
    normalised to JSON Schema on import.

    ## Tools

    Single-turn: the entry's functions; BFCL executes nothing for them, so the real executor only acknowledges
    a call (the reward judges the call itself). Multi-turn: every function of the entry's backend APIs (file system,
    Twitter, messaging, tickets, trading, travel, vehicle, math), run for real by BFCL's Python backends.

    ## Tasks

    BFCL's questions, in file order; ``test`` holds the entries whose id hashes into the test fifth (the rest is
    ``train``, for training on BFCL). Multi-turn entries replay their later user turns as scripted users. The
    reference trajectory is the ground truth: its first allowed value per parameter (single-turn, results
    unknown), a refusal (irrelevance), none (``live_relevance``: any call passes and BFCL records none), or the
    gold calls with their real backend results (multi-turn).

    ## Reward

    1 or 0. Single-turn: the calls of the first Act turn that makes any, checked by BFCL's AST rules
    (:mod:`envs.bfcl.checker`); irrelevance categories pass when no call is made at all, ``live_relevance``
    when any is. Multi-turn: BFCL's rules, turn by turn: backend state equal to the gold state, and every gold
    result among the model's results so far.

    ## Episode End

    Single-turn: the final answer; at most 3 Act turns. Multi-turn: the final answer after the last user turn;
    at most 8 Act turns per user turn.

    ## Arguments

    ``make_domain("bfcl:simple_python")``, or ``BFCLDomain("parallel", test_fraction=0.2)``. Needs the
    ``bfcl-eval`` data (``make benchmarks``).
    """

    def __init__(self, category: str = "simple_python", test_fraction: float = 0.2) -> None:
        if category in OTHER_LANGUAGES:
            raise DomainError(
                f"{category}: Java/JavaScript answers are judged in their own syntax; not supported as a domain"
            )
        if category not in SINGLE_TURN + MULTI_TURN:
            raise DomainError(f"unknown BFCL category {category!r}; choose from {SINGLE_TURN + MULTI_TURN}")
        self.category, self.test_fraction = category, test_fraction
        self.name = f"bfcl:{category}"
        self.description = f"BFCL v4 {category}"
        self.system_prompt = SYSTEM_PROMPT
        self.multi_turn = category in MULTI_TURN
        self.executes_calls = self.multi_turn  # single-turn entries are judged on the calls; nothing runs
        self.max_turns = 56 if self.multi_turn else 3  # multi-turn: up to 8 Act turns for each of <= 7 user turns
        self.known_issues = {k: f"BFCL's data: {v}" for k, v in REFUSED_BY_BFCL.items()}

    # -- data -------------------------------------------------------------------------------------------
    @cached_property
    def _entries(self) -> dict[str, tuple[dict[str, Any], Any]]:
        folder = data_dir()
        questions = read_jsonl(folder / f"BFCL_v4_{self.category}.json")
        answer_file = folder / "possible_answer" / f"BFCL_v4_{self.category}.json"
        answers = {a["id"]: a["ground_truth"] for a in read_jsonl(answer_file)} if answer_file.is_file() else {}
        for entry in questions:
            if self.multi_turn:
                entry["function"] = multi_turn_docs(entry["involved_classes"])
        return {q["id"]: (q, answers.get(q["id"])) for q in questions}

    @cached_property
    def _splits(self) -> dict[str, list[Task]]:
        out: dict[str, list[Task]] = {s: [] for s in SPLITS}
        for entry_id, (entry, answer) in self._entries.items():
            split = "test" if stable_hash(f"{self.name}:{entry_id}") % 1000 < self.test_fraction * 1000 else "train"
            out[split].append(self._task(entry, answer, split))
        return out

    def _task(self, entry: dict[str, Any], answer: Any, split: str) -> Task:
        turns = [[m for m in turn if m.get("role") != "system"] for turn in entry["question"]]
        system = "\n\n".join(m["content"] for turn in entry["question"] for m in turn if m.get("role") == "system")
        texts = ["\n\n".join(m["content"] for m in turn) for turn in turns if turn]
        reference: tuple[ReferenceTurn, ...] = ()
        if self.multi_turn:
            from .multi_turn import BFCLBackends, gold_turns

            gold = gold_turns(entry, answer)
            backends = BFCLBackends(entry.get("initial_config", {}), entry["involved_classes"])
            turns_out = []
            for calls in gold:
                for call in calls:
                    turns_out.append(ReferenceTurn("", (call,), (backends.execute(call),)))
                turns_out.append(ReferenceTurn(content="Done."))
            reference = tuple(turns_out)
        elif answer:
            calls = tuple(
                ToolCall(name, {k: _concrete(first) for k, first in _first_allowed(params).items()})
                for expected in answer
                for name, params in expected.items()
            )
            reference = (ReferenceTurn("", calls, (None,) * len(calls)), ReferenceTurn(content="Done."))
        elif self.category in IRRELEVANCE:
            reference = (ReferenceTurn(content="I cannot help with that using the functions I have."),)
        # live_relevance: any relevant call passes and BFCL records none, so there is no reference solution (a
        # refusal here would contradict the reward, and SFT would teach it)
        return Task(
            id=entry["id"],
            domain=self.name,
            prompt=texts[0] if texts else "",
            split=split,
            user_turns=tuple(texts[1:]),
            tools=tuple(dict.fromkeys(d["name"] for d in entry["function"])),
            reference=reference,
            initial_state=entry.get("initial_config", {}),
            expected={"entry_id": entry["id"]},
            system_prompt=system or None,
        )

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self._splits[check_split(split)]

    # -- tools, executor, reward ----------------------------------------------------------------------------
    @property
    def tools(self) -> ToolRegistry:
        raise DomainError("BFCL tasks bring their own tools: use tools_for(task)")

    def tools_for(self, task: Task) -> ToolRegistry:
        """The entry's functions, validated no more strictly than BFCL checks them (:mod:`envs.bfcl.schemas`)."""
        cache = self.__dict__.setdefault("_registries", {})
        if task.id not in cache:
            entry, answer = self._entries[task.id]
            docs = {d["name"]: d for d in entry["function"]}  # a few entries repeat a doc
            examples = self._gold_examples if self.multi_turn else possible_answer_examples(answer)
            cache[task.id] = ToolRegistry(
                lenient(from_bfcl(d), examples.get(name, {}), alternatives=not self.multi_turn)
                for name, d in docs.items()
            )
        return cache[task.id]

    @cached_property
    def _gold_examples(self) -> dict[str, dict[str, list]]:
        """Multi-turn: the arguments of every gold call of the category, by function and parameter."""
        from .multi_turn import gold_turns

        calls = (c for entry, answer in self._entries.values() for turn in gold_turns(entry, answer) for c in turn)
        return call_examples(calls)

    def tool_names(self) -> list[str]:
        return sorted({d["name"] for entry, _ in self._entries.values() for d in entry["function"]})

    def make_executor(self, task: Task) -> Any:
        if not self.multi_turn:
            return CallsOnly()  # single-turn BFCL judges the calls; nothing is executed
        from .multi_turn import BFCLBackends

        entry, _ = self._entries[task.id]
        return BFCLBackends(entry.get("initial_config", {}), entry["involved_classes"])

    def score(self, task: Task, trajectory: Trajectory) -> RewardResult:
        entry, answer = self._entries[task.id]
        if self.multi_turn:
            from .multi_turn import gold_turns, score_turns

            made: list[list[ToolCall]] = [[] for _ in entry["question"]]
            for record in trajectory.calls:
                if record.call is not None and record.validated and record.user_turn <= len(made):
                    made[record.user_turn - 1].append(record.call)
            ok, _ = score_turns(entry, gold_turns(entry, answer), made)
            return RewardResult.from_checks({"bfcl_multi_turn": ok})
        turns = sorted({r.turn for r in trajectory.calls if r.call is not None})
        first = [
            (r.call.name, dict(r.call.arguments)) for r in trajectory.calls if turns and r.turn == turns[0] and r.call
        ]
        if self.category in IRRELEVANCE:
            return RewardResult.from_checks({"no_call": not turns})
        if self.category == "live_relevance":
            return RewardResult.from_checks({"some_call": bool(turns)})
        ok, _ = check_calls(entry["function"], first, answer, self.category)
        return RewardResult.from_checks({"bfcl_ast": ok})

    def whitelist(self, task: Task) -> tuple[str, ...]:
        return task.tools
