"""``travel``: a multi-turn domain where a scripted user gives the details over several turns."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from envace_gym.domains import GeneratedDomain, ReferenceRecorder, Task
from envace_gym.tools import ToolExecutor, ToolFailure, tool

AIRPORTS = {
    "CDG": "Paris", "FCO": "Rome", "LHR": "London", "MAD": "Madrid", "BER": "Berlin", "AMS": "Amsterdam",
    "LIS": "Lisbon", "VIE": "Vienna",
}  # fmt: skip
Airport = Literal["CDG", "FCO", "LHR", "MAD", "BER", "AMS", "LIS", "VIE"]
Cabin = Literal["economy", "business"]
PASSENGERS = (
    "Ana Lima",
    "Ben Carter",
    "Chen Wei",
    "Dara Okafor",
    "Eva Novak",
    "Farid Haddad",
    "Grace Kim",
    "Hugo Martin",
)
BUSINESS_FACTOR = 2.5


class TravelTools(ToolExecutor):
    """Flight inventory and bookings: ``state = {"flights": [...], "bookings": {...}}``."""

    @tool
    def search_flights(self, origin: Airport, destination: Airport, date: str) -> dict:
        """Search the flights between two airports on a date, cheapest first.

        Args:
            origin: IATA code of the departure airport.
            destination: IATA code of the arrival airport.
            date: Travel date as YYYY-MM-DD.

        Returns:
            The matching flights with id, departure time, economy price and seats left.
        """
        found = [
            {"flight_id": f["flight_id"], "depart": f["depart"], "price": f["price"], "seats_left": f["seats_left"]}
            for f in self.state["flights"]
            if (f["origin"], f["destination"], f["date"]) == (origin, destination, date)
        ]
        return {"flights": sorted(found, key=lambda f: (f["price"], f["depart"]))}

    @tool
    def book_flight(self, flight_id: str, passenger_name: str, cabin: Cabin) -> dict:
        """Book a seat on a flight.

        Args:
            flight_id: The flight id from search_flights.
            passenger_name: Full name of the passenger.
            cabin: Cabin class.

        Returns:
            The booking id, flight, passenger, cabin and price paid.
        """
        flight = next((f for f in self.state["flights"] if f["flight_id"] == flight_id), None)
        if flight is None:
            raise ToolFailure(f"no flight {flight_id}")
        if flight["seats_left"] < 1:
            raise ToolFailure(f"flight {flight_id} is full")
        flight["seats_left"] -= 1
        booking_id = f"BK-{len(self.state['bookings']) + 1:04d}"
        price = round(flight["price"] * (BUSINESS_FACTOR if cabin == "business" else 1.0), 2)
        booking = {
            "booking_id": booking_id,
            "flight_id": flight_id,
            "passenger_name": passenger_name,
            "cabin": cabin,
            "price": price,
        }
        self.state["bookings"][booking_id] = booking
        return dict(booking)

    @tool
    def get_booking(self, booking_id: str) -> dict:
        """Look up a booking.

        Args:
            booking_id: The booking id, e.g. "BK-0001".

        Returns:
            The booking.
        """
        booking = self.state["bookings"].get(booking_id)
        if booking is None:
            raise ToolFailure(f"no booking {booking_id}")
        return dict(booking)

    @tool
    def cancel_booking(self, booking_id: str) -> dict:
        """Cancel a booking and free its seat.

        Args:
            booking_id: The booking id.

        Returns:
            The cancelled booking id.
        """
        booking = self.state["bookings"].pop(booking_id, None)
        if booking is None:
            raise ToolFailure(f"no booking {booking_id}")
        for f in self.state["flights"]:
            if f["flight_id"] == booking["flight_id"]:
                f["seats_left"] += 1
        return {"cancelled": booking_id}


class TravelDomain(GeneratedDomain):
    """
    ## Description

    A multi-turn domain: the user states the route first, the date when asked, and the choice (cheapest or
    earliest flight, cabin, passenger name) last. User turns are **scripted** (replayed from the task, as in
    the paper), one after each of the agent's final answers. The agent must ask, then search, then book the
    right flight: rehearsal must produce a flight list consistent with the reference inventory and a
    booking that follows from it.

    ## Tools

    ``search_flights(origin, destination, date)`` (IATA enums), ``book_flight(flight_id, passenger_name,
    cabin)`` (``economy``/``business``; business costs 2.5x), ``get_booking(booking_id)``,
    ``cancel_booking(booking_id)``. Tasks whitelist the first three; ``cancel_booking`` is never offered.

    ## Tasks

    Each task has its own inventory: 6 to 9 flights on the asked route over three dates, plus decoys on
    the reverse route. Three user turns: route → date → choice. The reference solution asks for the date,
    searches, then books, and is run on the real executor. 20% of parameter hashes are ``test``.

    ## Reward

    Checklist, equal weights: ``state`` (replaying the agent's valid calls gives exactly the reference
    booking and seat counts) and ``answer_contains`` (the booking id is in the final answers).

    ## Episode End

    The final answer after the last scripted user turn; at most 8 Act turns (the ``max_turns`` of its spec, ``travel-v0``).

    ## Arguments

    ``make_domain("travel-v0", num_tasks={"train": 1000, "test": 200}, seed=0)``.
    """

    name = "travel"
    description = "Flight booking over several user turns, with scripted users; scored on the bookings."
    system_prompt = (
        "You are a travel agent. Airports: "
        + ", ".join(f"{city} ({code})" for code, city in AIRPORTS.items())
        + ". Ask for what you are missing, search before booking, book only what the user chose, "
        "and give the booking id when you are done."
    )
    executor_class = TravelTools

    def sample_params(self, rng: np.random.Generator) -> dict[str, Any]:
        origin, destination = (str(c) for c in rng.choice(list(AIRPORTS), size=2, replace=False))
        day = int(rng.integers(1, 26))
        dates = [f"2026-12-{day + k:02d}" for k in range(3)]
        flights = []
        for k in range(int(rng.integers(6, 10))):
            date = dates[k % 3] if k >= 3 else dates[1]  # at least three flights on the asked date
            flights.append(
                {
                    "flight_id": f"EA{int(rng.integers(100, 999))}{k}",
                    "origin": origin,
                    "destination": destination,
                    "date": date,
                    "depart": f"{int(rng.integers(6, 22)):02d}:{int(rng.choice([0, 15, 30, 45])):02d}",
                    "price": float(rng.integers(60, 400)),
                    "seats_left": int(rng.integers(1, 9)),
                }
            )
        for k in range(2):  # decoys on the reverse route
            flights.append(
                {
                    **flights[k],
                    "flight_id": f"EB{int(rng.integers(100, 999))}{k}",
                    "origin": destination,
                    "destination": origin,
                }
            )
        return {
            "origin": origin,
            "destination": destination,
            "date": dates[1],
            "flights": flights,
            "choice": str(rng.choice(["cheapest", "earliest"])),
            "cabin": str(rng.choice(["economy", "business"])),
            "passenger": str(rng.choice(PASSENGERS)),
        }

    def task_key(self, params: dict[str, Any]) -> str:
        f = sorted((x["flight_id"], x["depart"], x["price"]) for x in params["flights"])
        return f"{params['origin']}>{params['destination']}@{params['date']}:{params['choice']}:{params['cabin']}:{params['passenger']}:{f}"

    def build_task(self, params: dict[str, Any], task_id: str, split: str) -> Task:
        state = {"flights": params["flights"], "bookings": {}}
        origin, destination, date = params["origin"], params["destination"], params["date"]
        rec = ReferenceRecorder(TravelTools(state))
        rec.answer("Sure. On which date would you like to travel?")
        found = rec.call("search_flights", origin=origin, destination=destination, date=date)["flights"]
        listing = "; ".join(f"{f['flight_id']} at {f['depart']} for {f['price']:.2f} USD" for f in found)
        rec.answer(f"I found {len(found)} flights: {listing}. Which one should I book, in which cabin, and for whom?")
        key = (
            (lambda f: (f["price"], f["depart"]))
            if params["choice"] == "cheapest"
            else (lambda f: (f["depart"], f["price"]))
        )
        pick = min(found, key=key)
        booking = rec.call(
            "book_flight", flight_id=pick["flight_id"], passenger_name=params["passenger"], cabin=params["cabin"]
        )
        rec.answer(
            f"Booked {pick['flight_id']} ({params['cabin']}) for {params['passenger']}: booking {booking['booking_id']}, "
            f"{booking['price']:.2f} USD."
        )
        return Task(
            id=task_id,
            domain=self.name,
            prompt=f"Hi! I need a flight from {AIRPORTS[origin]} to {AIRPORTS[destination]}.",
            split=split,
            user_turns=(
                f"I'd like to fly on {date}.",
                f"Please book the {params['choice']} one, {params['cabin']} class, for {params['passenger']}.",
            ),
            tools=("search_flights", "book_flight", "get_booking"),
            reference=rec.turns,
            initial_state=state,
            expected={"state": rec.executor.snapshot(), "answer_contains": [booking["booking_id"]]},
        )
