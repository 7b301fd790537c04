"""``bank``: a stateful multi-step domain scored on the final state of the ledger."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from envace_gym.domains import GeneratedDomain, ReferenceRecorder, Task
from envace_gym.tools import ToolExecutor, ToolFailure, tool

PEOPLE = (
    "Ana Lima", "Ben Carter", "Chen Wei", "Dara Okafor", "Eva Novak", "Farid Haddad", "Grace Kim", "Hugo Martin",
    "Ines Duarte", "Jonas Berg", "Kira Sato", "Leo Rossi", "Maya Patel", "Nils Olsen", "Omar Aziz", "Priya Nair",
)  # fmt: skip
AccountType = Literal["checking", "savings"]


class BankTools(ToolExecutor):
    """The ledger: ``state = {"accounts": {id: {"owner", "type", "balance"}}, "transactions": [...]}``."""

    def _account(self, account_id: str) -> dict[str, Any]:
        account = self.state["accounts"].get(account_id)
        if account is None:
            raise ToolFailure(f"no account {account_id}")
        return account

    @tool
    def find_accounts(self, owner: str) -> dict:
        """Find the accounts of a customer by full name.

        Args:
            owner: The customer's full name, e.g. "Ana Lima".

        Returns:
            The customer's accounts, each with its id and type.
        """
        found = [
            {"account_id": aid, "type": a["type"]}
            for aid, a in sorted(self.state["accounts"].items())
            if a["owner"].lower() == owner.strip().lower()
        ]
        if not found:
            raise ToolFailure(f"no customer named {owner}")
        return {"owner": owner, "accounts": found}

    @tool
    def get_balance(self, account_id: str) -> dict:
        """Get the current balance of an account.

        Args:
            account_id: The account id, e.g. "ACC-1042".

        Returns:
            The account id, its balance and currency.
        """
        account = self._account(account_id)
        return {"account_id": account_id, "balance": account["balance"], "currency": "USD"}

    @tool
    def transfer(self, from_account: str, to_account: str, amount: float) -> dict:
        """Move money between two accounts.

        Args:
            from_account: The account id to take the money from.
            to_account: The account id to send the money to.
            amount: The amount in USD, positive, at most 2 decimals.

        Returns:
            The transaction id and both new balances.
        """
        source, target = self._account(from_account), self._account(to_account)
        if from_account == to_account:
            raise ToolFailure("cannot transfer to the same account")
        if amount <= 0 or round(amount, 2) != amount:
            raise ToolFailure("amount must be positive with at most 2 decimals")
        if source["balance"] < amount:
            raise ToolFailure(f"insufficient funds: balance is {source['balance']:.2f} USD")
        source["balance"] = round(source["balance"] - amount, 2)
        target["balance"] = round(target["balance"] + amount, 2)
        txn = f"T{len(self.state['transactions']) + 1:04d}"
        self.state["transactions"].append({"id": txn, "from": from_account, "to": to_account, "amount": amount})
        return {"transaction_id": txn, "from_balance": source["balance"], "to_balance": target["balance"]}

    @tool
    def list_transactions(self, account_id: str, limit: int = 5) -> dict:
        """List the most recent transactions touching an account.

        Args:
            account_id: The account id.
            limit: How many transactions to return, most recent first.

        Returns:
            The transactions, most recent first.
        """
        self._account(account_id)
        mine = [t for t in self.state["transactions"] if account_id in (t["from"], t["to"])]
        return {"account_id": account_id, "transactions": list(reversed(mine))[: max(0, limit)]}


class BankDomain(GeneratedDomain):
    """
    ## Description

    A stateful, multi-step domain in the spirit of τ²-Bench: customers are named, accounts are not, so the
    agent must **look up** (``find_accounts``), **act** (``transfer``) and **confirm** (``get_balance``),
    keeping ids and amounts straight across turns. Rehearsal has to stay consistent: the balance the
    rehearse role reports after a transfer must follow from the one it reported before.

    ## Tools

    ``find_accounts(owner)``, ``get_balance(account_id)``, ``transfer(from_account, to_account, amount)``,
    ``list_transactions(account_id, limit=5)``. Failures (unknown customer, insufficient funds, ...) return
    ``{"error": ...}``. Tasks whitelist the first three: ``list_transactions`` exists but is never offered,
    so calling it is ``TOOL_NOT_AVAILABLE`` (the whitelist at work).

    ## Tasks

    Each task has its own small bank (3 to 5 customers with a checking and a savings account, random
    balances) and one of four templates: ``move`` (between one's own accounts, then report the balance),
    ``pay`` (to another customer), ``conditional`` (move only if a balance is high enough), ``total``
    (sum of one's balances, no write). The reference solution is run on the real executor, so its results
    (the rehearse role's privileged context) are real. 20% of parameter hashes are ``test``.

    ## Reward

    Checklist, equal weights: ``state`` (replaying every valid call the agent made, rehearsed or not, into a
    fresh bank gives exactly the reference's final ledger: τ²'s database check) and ``answer_numbers`` (the
    amount the user asked about appears in the final answer).

    ## Episode End

    The final answer; at most 8 Act turns (the ``max_turns`` of its spec, ``bank-v0``).

    ## Arguments

    ``make_domain("bank-v0", num_tasks={"train": 1000, "test": 200}, seed=0)``.
    """

    name = "bank"
    description = "Banking: look up accounts, move money, confirm balances; scored on the final ledger."
    system_prompt = (
        "You are a bank assistant. Customers give their names, not account ids: look accounts up first. "
        "Only move money the customer asked to move, and never twice. Report amounts in USD with 2 decimals."
    )
    executor_class = BankTools
    TEMPLATES = ("move", "pay", "conditional", "total")

    def sample_params(self, rng: np.random.Generator) -> dict[str, Any]:
        n = int(rng.integers(3, 6))
        people = [str(p) for p in rng.choice(PEOPLE, size=n, replace=False)]
        ids = [int(i) for i in rng.choice(np.arange(1000, 9999), size=2 * n, replace=False)]
        accounts = {}
        for k, person in enumerate(people):
            for j, kind in enumerate(("checking", "savings")):
                accounts[f"ACC-{ids[2 * k + j]}"] = {
                    "owner": person,
                    "type": kind,
                    "balance": round(float(rng.integers(2000, 500000)) / 100, 2),
                }
        template = str(rng.choice(self.TEMPLATES))
        amount = round(float(rng.integers(1, 400)) * 5.0, 2)
        return {
            "template": template,
            "accounts": accounts,
            "customer": people[0],
            "other": people[1],
            "amount": amount,
            "direction": str(rng.choice(["checking", "savings"])),
            "threshold": round(float(rng.integers(20, 3000)) * 1.0, 2),
        }

    def task_key(self, params: dict[str, Any]) -> str:
        balances = sorted((a["owner"], a["type"], a["balance"]) for a in params["accounts"].values())
        return f"{params['template']}:{params['customer']}:{params['other']}:{params['amount']}:{params['direction']}:{params['threshold']}:{balances}"

    def build_task(self, params: dict[str, Any], task_id: str, split: str) -> Task:
        state = {"accounts": params["accounts"], "transactions": []}
        rec = ReferenceRecorder(BankTools(state))
        me, other, amount = params["customer"], params["other"], params["amount"]
        src_type = params["direction"]
        dst_type = "savings" if src_type == "checking" else "checking"
        mine = {a["type"]: a["account_id"] for a in rec.call("find_accounts", owner=me)["accounts"]}
        template = params["template"]
        if template == "move":
            prompt = f"Hi, I'm {me}. Please move {amount:.2f} USD from my {src_type} account to my {dst_type} account, then tell me my new {src_type} balance."
            moved = rec.call("transfer", from_account=mine[src_type], to_account=mine[dst_type], amount=amount)
            balance = rec.call("get_balance", account_id=mine[src_type])["balance"]
            if "error" in moved:
                reply = f"I could not move the money ({moved['error']}). Your {src_type} balance is {balance:.2f} USD."
            else:
                reply = (
                    f"Done (transaction {moved['transaction_id']}). Your {src_type} balance is now {balance:.2f} USD."
                )
            numbers = [balance]
        elif template == "pay":
            prompt = f"This is {me}. Send {amount:.2f} USD from my checking account to {other}'s savings account and tell me what is left in my checking."
            theirs = {a["type"]: a["account_id"] for a in rec.call("find_accounts", owner=other)["accounts"]}
            result = rec.call("transfer", from_account=mine["checking"], to_account=theirs["savings"], amount=amount)
            if "error" in result:
                left = rec.call("get_balance", account_id=mine["checking"])["balance"]
                reply = f"I could not send the money ({result['error']}). Your checking balance is {left:.2f} USD."
            else:
                left = result["from_balance"]
                reply = f"Sent. Transaction {result['transaction_id']}; your checking balance is now {left:.2f} USD."
            numbers = [left]
        elif template == "conditional":
            threshold = params["threshold"]
            prompt = (
                f"I'm {me}. If my {src_type} balance is at least {threshold:.2f} USD, move {amount:.2f} USD from it to my "
                f"{dst_type} account; otherwise leave everything as it is. Tell me the {src_type} balance afterwards."
            )
            balance = rec.call("get_balance", account_id=mine[src_type])["balance"]
            if balance >= threshold and balance >= amount:
                balance = rec.call("transfer", from_account=mine[src_type], to_account=mine[dst_type], amount=amount)[
                    "from_balance"
                ]
                reply = f"Your {src_type} balance was above {threshold:.2f} USD, so I moved {amount:.2f} USD. It is now {balance:.2f} USD."
            else:
                reply = f"Your {src_type} balance is {balance:.2f} USD, so I left everything as it is."
            numbers = [balance]
        else:  # total
            prompt = f"Hello, {me} here. What is the total balance across my checking and savings accounts?"
            a = rec.call("get_balance", account_id=mine["checking"])["balance"]
            b = rec.call("get_balance", account_id=mine["savings"], same_turn=True)["balance"]
            total = round(a + b, 2)
            reply = f"Checking {a:.2f} USD + savings {b:.2f} USD = {total:.2f} USD in total."
            numbers = [total]
        rec.answer(reply)
        return Task(
            id=task_id,
            domain=self.name,
            prompt=prompt,
            split=split,
            tools=("find_accounts", "get_balance", "transfer"),
            reference=rec.turns,
            initial_state=state,
            expected={"state": rec.executor.snapshot(), "answer_numbers": numbers},
        )
