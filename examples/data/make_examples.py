"""Writes the three example datasets in this folder (the same ten conversations in each format).

    python examples/data/make_examples.py

The conversations are ours: a small travel-desk assistant with three tools. They exist to show the formats
``gym.make("EnvACE-Rehearsal-v0", domain="examples/data/<file>")`` reads; see docs/datasets.md.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Today's weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name."}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between two currencies at today's rate.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"}, "source": {"type": "string", "description": "ISO code, e.g. EUR."},
            "target": {"type": "string", "description": "ISO code, e.g. USD."}},
            "required": ["amount", "source", "target"]}}},
    {"type": "function", "function": {
        "name": "book_table", "description": "Book a restaurant table.",
        "parameters": {"type": "object", "properties": {
            "restaurant": {"type": "string"}, "people": {"type": "integer"}, "time": {"type": "string"}},
            "required": ["restaurant", "people", "time"]}}},
]  # fmt: skip
SYSTEM = "You are a travel-desk assistant. Use the tools, then answer in one sentence."

# (user turns, [(calls, results) per assistant step], final answers per user turn, checks)
WEATHER = {"Lisbon": (21, "sunny"), "Oslo": (4, "snow"), "Rome": (18, "cloudy"), "Cairo": (31, "clear")}
RATES = {("EUR", "USD"): 1.08, ("USD", "JPY"): 151.2, ("GBP", "EUR"): 1.17}


def weather(city):
    t, sky = WEATHER[city]
    return {"city": city, "temperature_c": t, "sky": sky}


def convert(amount, source, target):
    return {"amount": round(amount * RATES[(source, target)], 2), "currency": target}


def booking(restaurant, people, time):
    return {"restaurant": restaurant, "people": people, "time": time, "confirmation": f"BK-{people}{time[:2]}"}


CONVERSATIONS = []
for city in WEATHER:
    w = weather(city)
    CONVERSATIONS.append(([f"What's the weather in {city} today?"],
                          [[[("get_weather", {"city": city}, w)]]],
                          [f"It is {w['temperature_c']} °C and {w['sky']} in {city}."],
                          {"answer_numbers": [w["temperature_c"]]}))  # fmt: skip
for (source, target), _ in RATES.items():
    c = convert(250, source, target)
    CONVERSATIONS.append(([f"How much is 250 {source} in {target}?"],
                          [[[("convert_currency", {"amount": 250, "source": source, "target": target}, c)]]],
                          [f"250 {source} is {c['amount']} {target}."],
                          {"answer_numbers": [c["amount"]]}))  # fmt: skip
b = booking("Tasca Lina", 4, "20:00")
CONVERSATIONS.append((["Book Tasca Lina for 4 people at 20:00.", "And how is the weather in Lisbon?"],
                      [[[("book_table", {"restaurant": "Tasca Lina", "people": 4, "time": "20:00"}, b)]],
                       [[("get_weather", {"city": "Lisbon"}, weather("Lisbon"))]]],
                      [f"Booked: confirmation {b['confirmation']}.", "It is 21 °C and sunny in Lisbon."],
                      {"answer_contains": [b["confirmation"]]}))  # fmt: skip
w, c = weather("Rome"), convert(80, "EUR", "USD")
CONVERSATIONS.append((["Is it warm in Rome, and what are 80 EUR in USD?"],
                      [[[("get_weather", {"city": "Rome"}, w), ("convert_currency",
                          {"amount": 80, "source": "EUR", "target": "USD"}, c)]]],
                      [f"Rome is {w['temperature_c']} °C; 80 EUR is {c['amount']} USD."],
                      {"answer_numbers": [c["amount"]]}))  # fmt: skip
b = booking("Sakura", 2, "19:30")
CONVERSATIONS.append((["Please get me a table at Sakura for 2 at 19:30."],
                      [[[("book_table", {"restaurant": "Sakura", "people": 2, "time": "19:30"}, b)]]],
                      [f"Done: your confirmation is {b['confirmation']}."],
                      {"answer_contains": [b["confirmation"]]}))  # fmt: skip


def openai_messages(users, steps, finals):
    messages = [{"role": "system", "content": SYSTEM}]
    n = 0
    for user, turn_steps, final in zip(users, steps, finals, strict=True):
        messages.append({"role": "user", "content": user})
        for step in turn_steps:
            calls = [{"id": f"c{n + i}", "type": "function", "function": {"name": name, "arguments": args}}
                     for i, (name, args, _) in enumerate(step)]  # fmt: skip
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
            for i, (name, _, result) in enumerate(step):
                messages.append(
                    {"role": "tool", "tool_call_id": f"c{n + i}", "name": name, "content": json.dumps(result)}
                )
            n += len(step)
        messages.append({"role": "assistant", "content": final})
    return messages


def checklist(users, steps, finals):
    """One checklist, one list of items per user turn (the paper's checklist_list[checklist][turn][items])."""
    turns = []
    for turn_steps, final in zip(steps, finals, strict=True):
        items = [{"question": f"Did the assistant call {name} with {json.dumps(args)}?", "focus_on": "tool calls",
                  "pass_condition": f"a {name} call with these arguments", "weight": 1.0 / (1 + sum(map(len, turn_steps))),
                  "required_for_next_turn": False}
                 for step in turn_steps for name, args, _ in step]  # fmt: skip
        items.append({"question": "Does the answer state the tool's result correctly?", "focus_on": "final answer",
                      "pass_condition": f"consistent with: {final}", "weight": 1.0 / (1 + sum(map(len, turn_steps))),
                      "required_for_next_turn": False})  # fmt: skip
        turns.append(items)
    return [turns]


def sharegpt(users, steps, finals):
    conversations = []
    for user, turn_steps, final in zip(users, steps, finals, strict=True):
        conversations.append({"from": "human", "value": user})
        for step in turn_steps:
            blocks = "\n".join(
                "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"
                for name, args, _ in step
            )
            conversations.append({"from": "gpt", "value": blocks})
            for _, _, result in step:
                conversations.append(
                    {"from": "tool", "value": "<tool_response>\n" + json.dumps(result) + "\n</tool_response>"}
                )
        conversations.append({"from": "gpt", "value": final})
    return conversations


def main() -> None:
    with open(HERE / "openai.jsonl", "w", encoding="utf-8") as out:
        for k, (users, steps, finals, checks) in enumerate(CONVERSATIONS):
            row = {"id": f"desk/{k:03d}", "messages": openai_messages(users, steps, finals), "tools": TOOLS,
                   "expected": checks}  # fmt: skip
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(HERE / "envace.jsonl", "w", encoding="utf-8") as out:
        for k, (users, steps, finals, _) in enumerate(CONVERSATIONS):
            full = openai_messages(users, steps, finals)
            extra = {"index": f"desk/{k:03d}", "tools": json.dumps(TOOLS), "messages": full,
                     "interaction_kwargs": {"checklist_list": checklist(users, steps, finals)}}  # fmt: skip
            out.write(json.dumps({"messages": full[:2], "extra_info": extra}, ensure_ascii=False) + "\n")
    with open(HERE / "sharegpt.jsonl", "w", encoding="utf-8") as out:
        for k, (users, steps, finals, _) in enumerate(CONVERSATIONS):
            row = {"id": f"desk/{k:03d}", "conversations": sharegpt(users, steps, finals), "system": SYSTEM,
                   "tools": json.dumps([t["function"] for t in TOOLS])}  # fmt: skip
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
