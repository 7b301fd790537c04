"""A calendar domain written from the docs alone, as a new user would: three tools, a seeded generator, a
reward on the final state and the answer. It is the domain the quick run of README ("The first hour on your
own domain") was measured on, and what ``tests/test_quick_run.py`` trains.

Train it (a short SFT on its reference rows, then role-wise GRPO; docs/training.md, "The quick run"):

    envace train --domain examples/calendar_domain.py:CalendarDomain --model tiny --warm_start sft --steps 4

Run:  python examples/calendar_domain.py   (plays one task's reference with the real tools and a rehearsal)
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import envace_gym  # noqa: F401
from envace_gym import GeneratedDomain, ReferenceRecorder, Task, ToolExecutor, ToolFailure, register_domain, tool
from envace_gym.testing import ScriptedPolicy, oracle_policy

DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday")
TITLES = ("dentist", "gym", "standup", "lunch", "review", "call")
HOURS = (9, 10, 11, 14, 15, 16)


class CalendarTools(ToolExecutor):
    """The real executor: ``self.state["events"]`` maps an event id to its day, hour and title."""

    @tool
    def list_events(self, day: str) -> dict:
        """List the events of a day.

        Args:
            day: The weekday, e.g. monday.

        Returns:
            The day's events with their ids, hours and titles.
        """
        events = [
            {"event_id": eid, "hour": e["hour"], "title": e["title"]}
            for eid, e in sorted(self.state["events"].items())
            if e["day"] == day.lower()
        ]
        return {"day": day.lower(), "events": events}

    @tool
    def create_event(self, day: str, hour: int, title: str) -> dict:
        """Add an event to the calendar.

        Args:
            day: The weekday, e.g. monday.
            hour: The hour it starts, 0 to 23.
            title: What the event is.

        Returns:
            The new event with its id.
        """
        if day.lower() not in DAYS:
            raise ToolFailure(f"no day {day}")  # the agent sees {"error": ...}
        taken = {(e["day"], e["hour"]) for e in self.state["events"].values()}
        if (day.lower(), hour) in taken:
            raise ToolFailure(f"{day} at {hour} is taken")
        event_id = f"E{len(self.state['events']) + 1:02d}"
        while event_id in self.state["events"]:
            event_id = f"E{int(event_id[1:]) + 1:02d}"
        self.state["events"][event_id] = {"day": day.lower(), "hour": hour, "title": title}
        return {"event_id": event_id, "day": day.lower(), "hour": hour, "title": title}

    @tool
    def delete_event(self, event_id: str) -> dict:
        """Remove an event.

        Args:
            event_id: The id from list_events.

        Returns:
            The removed event's id.
        """
        if self.state["events"].pop(event_id, None) is None:
            raise ToolFailure(f"no event {event_id}")
        return {"deleted": event_id}


class CalendarDomain(GeneratedDomain):
    """
    ## Description
    Keep a week's calendar: add an event at a free hour, or cancel a named one.

    ## Tools
    ``list_events(day)``, ``create_event(day, hour, title)``, ``delete_event(event_id)``.

    ## Tasks
    A week of 3 to 5 events (ids E01...). Half the tasks add an event (one call, report its id); half cancel the
    event with a given title on a given day (list that day, delete its id, report the id).

    ## Reward
    ``state`` (the final calendar equals the reference's, weight 2) and ``answer_contains`` (the event id, weight
    1): an episode that makes the right change but does not report the id earns 2/3.

    ## Episode End
    The final answer; at most 4 Act turns.
    """

    name = "calendar"
    description = "Keep a week's calendar: add an event, or cancel one by title and day."
    system_prompt = "You manage the user's calendar. Use the tools, then report the event id."
    max_turns = 4
    executor_class = CalendarTools
    num_tasks = {"train": 60, "test": 12}

    def sample_params(self, rng: np.random.Generator) -> dict:
        slots = [(d, h) for d in DAYS for h in HOURS]
        chosen = rng.choice(len(slots), size=int(rng.integers(3, 6)) + 1, replace=False)
        titles = rng.choice(TITLES, size=len(chosen) - 1, replace=False)  # distinct: "cancel the gym" names one
        events = {
            f"E{k + 1:02d}": {"day": slots[i][0], "hour": int(slots[i][1]), "title": str(title)}
            for k, (i, title) in enumerate(zip(chosen[:-1], titles, strict=True))
        }
        free_day, free_hour = slots[chosen[-1]]
        if rng.random() < 0.5:
            return {"events": events, "kind": "create", "day": free_day, "hour": int(free_hour),
                    "title": str(rng.choice(TITLES))}  # fmt: skip
        target = str(rng.choice(sorted(events)))
        return {"events": events, "kind": "delete", "day": events[target]["day"], "title": events[target]["title"]}

    def build_task(self, params: dict, task_id: str, split: str) -> Task:
        state = {"events": params["events"]}
        rec = ReferenceRecorder(CalendarTools(state))  # the reference runs on the real executor
        if params["kind"] == "create":
            made = rec.call("create_event", day=params["day"], hour=params["hour"], title=params["title"])
            event_id = made["event_id"]
            prompt = f"Add {params['title']} on {params['day']} at {params['hour']}."
        else:
            listed = rec.call("list_events", day=params["day"])["events"]
            event_id = next(e["event_id"] for e in listed if e["title"] == params["title"])
            rec.call("delete_event", event_id=event_id)
            prompt = f"Cancel the {params['title']} on {params['day']}."
        rec.answer(f"Done: {event_id}.")
        return Task(
            id=task_id,
            domain=self.name,
            prompt=prompt,
            split=split,
            reference=rec.turns,
            initial_state=state,
            expected={
                "state": rec.executor.snapshot(),
                "answer_contains": [event_id],
                "weights": {"state": 2, "answer_contains": 1},  # partial credit: the change counts on its own
            },
        )


def main() -> None:
    register_domain("calendar", CalendarDomain, overwrite=True)
    domain = CalendarDomain()
    for task in domain.tasks("train")[:2]:
        print(task.prompt)
        for executor, policy in (("real", ScriptedPolicy([])), ("rehearsal", oracle_policy(domain, task))):
            env = gym.make("EnvACE-Rehearsal-v0", domain="calendar", policy=policy, executor=executor)
            env.reset(options={"task": task.id})
            for turn in task.reference:
                obs, reward, terminated, truncated, info = env.step(turn.text)
            print(f"{executor:>9}: reward {reward:.1f}, checks {info['reward_checks']}")


if __name__ == "__main__":
    main()
