"""Write your own domain: tools as typed, documented methods; a seeded task generator; a reward.

This example builds a tiny library domain (search the catalogue, borrow a book), registers it under a
name, and plays one task through `gym.make` with the real executor and with a perfect simulator.
Run:  python examples/custom_domain.py
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import envace_gym  # noqa: F401
from envace_gym import GeneratedDomain, ReferenceRecorder, Task, ToolExecutor, ToolFailure, register_domain, tool
from envace_gym.testing import ScriptedPolicy, oracle_policy

TITLES = ("Dune", "Emma", "Ulysses", "Beloved", "Solaris", "Hamlet", "Persuasion", "Middlemarch")


class LibraryTools(ToolExecutor):
    """The real executor: `self.state` is this episode's own copy of the task's initial state."""

    @tool
    def search_catalogue(self, title: str) -> dict:
        """Find a book by title.

        Args:
            title: The book's title.

        Returns:
            The matching books with their ids and whether they are available.
        """
        books = [
            {"book_id": bid, "title": b["title"], "available": b["borrower"] is None}
            for bid, b in sorted(self.state["books"].items())
            if b["title"].lower() == title.lower()
        ]
        return {"books": books}

    @tool
    def borrow(self, book_id: str, reader: str) -> dict:
        """Borrow a book.

        Args:
            book_id: The id from search_catalogue.
            reader: The reader's name.

        Returns:
            The loan.
        """
        book = self.state["books"].get(book_id)
        if book is None:
            raise ToolFailure(f"no book {book_id}")  # the agent sees {"error": ...}
        if book["borrower"] is not None:
            raise ToolFailure(f"{book_id} is already borrowed")
        book["borrower"] = reader
        return {"book_id": book_id, "reader": reader, "due": "in 3 weeks"}


class LibraryDomain(GeneratedDomain):
    """
    ## Description
    Borrow a named book for a reader: look it up, then borrow an available copy.

    ## Tools
    ``search_catalogue(title)``, ``borrow(book_id, reader)``.

    ## Tasks
    A catalogue of 2 copies of each title, some already borrowed; one title and one reader per task.

    ## Reward
    ``state``: the final catalogue equals the reference's; ``answer_contains``: the book id is reported.

    ## Episode End
    The final answer; at most 4 Act turns.
    """

    name = "library"
    description = "Borrow books: search, then borrow an available copy."
    system_prompt = "You are a librarian. Search the catalogue before borrowing, and report the book id."
    max_turns = 4
    executor_class = LibraryTools
    num_tasks = {"train": 50, "test": 10}

    def sample_params(self, rng: np.random.Generator) -> dict:
        books = {
            f"B{k:03d}": {"title": title, "borrower": "someone" if rng.random() < 0.3 and copy == 0 else None}
            for k, (title, copy) in enumerate((t, c) for t in TITLES for c in range(2))
        }
        return {"books": books, "title": str(rng.choice(TITLES)), "reader": str(rng.choice(["Ana", "Ben", "Chen"]))}

    def build_task(self, params: dict, task_id: str, split: str) -> Task:
        state = {"books": params["books"]}
        rec = ReferenceRecorder(LibraryTools(state))  # the reference runs on the real executor
        found = rec.call("search_catalogue", title=params["title"])["books"]
        book = next(b for b in found if b["available"])
        rec.call("borrow", book_id=book["book_id"], reader=params["reader"])
        rec.answer(f"Done: {params['reader']} has borrowed {book['book_id']}.")
        return Task(
            id=task_id,
            domain=self.name,
            prompt=f"Please borrow {params['title']} for {params['reader']}.",
            split=split,
            reference=rec.turns,
            initial_state=state,
            expected={"state": rec.executor.snapshot(), "answer_contains": [book["book_id"]]},
        )


def main() -> None:
    register_domain("library", LibraryDomain, overwrite=True)  # now domain="library" works everywhere
    domain = LibraryDomain()
    task = domain.tasks("train")[0]
    print(task.prompt)
    for executor, policy in (("real", ScriptedPolicy([])), ("rehearsal", oracle_policy(domain, task))):
        env = gym.make("EnvACE-Rehearsal-v0", domain="library", policy=policy, executor=executor)
        env.reset(options={"task": task.id})
        for turn in task.reference:
            obs, reward, terminated, truncated, info = env.step(turn.text)
        print(f"{executor:>9}: reward {reward:.1f}, checks {info['reward_checks']}")


if __name__ == "__main__":
    main()
