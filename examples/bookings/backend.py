"""The travel company's own booking system, faked: a flight catalogue and a ledger file.

It stands in for the integrator's real backend (an airline or booking API).
The ledger is a SQLite file (``BOOKINGS_LEDGER``, default
``var/bookings-ledger.sqlite3``), so every process that runs tools or
reconcile hooks (``serve``, ``rundramatiq`` workers, the sweeper) sees the
same bookings. Like a real payment or booking API, it deduplicates writes
by the idempotency key it is given: the same key twice is one booking.
"""

import json
import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path

PREFIX = {"booking": "BK", "catering": "ML"}  # booking BK00001, catering order ML00002
DEFAULT_LEDGER = Path(__file__).resolve().parents[2] / "var" / "bookings-ledger.sqlite3"
FLIGHTS = {
    "TG640": {"origin": "BKK", "destination": "NRT", "date": "2027-03-14", "fare": 420.0, "seats": 9},
    "TG642": {"origin": "BKK", "destination": "NRT", "date": "2027-03-14", "fare": 515.0, "seats": 0},
    "TG910": {"origin": "BKK", "destination": "LHR", "date": "2027-03-15", "fare": 780.0, "seats": 4},
}


class SoldOut(Exception):
    """No seat is left on the flight: nothing was booked."""


@contextmanager
def _ledger():
    """A connection to the ledger inside one write-locked transaction, committed when the block ends."""
    path = Path(os.environ.get("BOOKINGS_LEDGER") or DEFAULT_LEDGER)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("CREATE TABLE IF NOT EXISTS entry (n INTEGER PRIMARY KEY, key TEXT UNIQUE, kind TEXT, "
                   "ref TEXT, flight TEXT, body TEXT)")
        yield db
        db.execute("COMMIT")
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.close()


def _seats_left(db, number: str) -> int:
    taken = db.execute("SELECT count(*) FROM entry WHERE kind = 'booking' AND flight = ?", (number,)).fetchone()[0]
    return FLIGHTS[number]["seats"] - taken


def flight(number: str) -> dict | None:
    """One flight with its ``seats_left``, or None."""
    if number not in FLIGHTS:
        return None
    with _ledger() as db:
        return {"flight": number, **FLIGHTS[number], "seats_left": _seats_left(db, number)}


def search(origin: str, destination: str, date: str) -> list[dict]:
    """The flights from ``origin`` to ``destination`` on ``date`` (ISO), with fares and seats left."""
    numbers = [number for number, f in FLIGHTS.items() if (f["origin"], f["destination"], f["date"]) ==
               (origin, destination, date)]
    return [flight(number) for number in numbers]


def _write(key: str, kind: str, flight_number: str, make_body) -> dict:
    """Store ``make_body(ref, db)`` under ``key`` once; the same key again returns what was stored."""
    with _ledger() as db:
        found = db.execute("SELECT body FROM entry WHERE key = ?", (key,)).fetchone()
        if found:
            return json.loads(found[0])
        n = db.execute("SELECT coalesce(max(n), 0) + 1 FROM entry").fetchone()[0]
        body = make_body(f"{PREFIX[kind]}{n:05d}", db)
        db.execute("INSERT INTO entry VALUES (?, ?, ?, ?, ?, ?)",
                   (n, key, kind, body["ref"], flight_number, json.dumps(body)))
        return body


def book(key: str, number: str, passenger: str, customer: str) -> dict:
    """Book a seat on flight ``number`` (idempotent by ``key``). Raises ``SoldOut``."""
    def make(ref, db):
        if _seats_left(db, number) < 1:
            raise SoldOut(f"Flight {number} is full.")
        return {"ref": ref, "flight": number, "passenger": passenger, "customer": customer,
                "fare": FLIGHTS[number]["fare"], "status": "confirmed"}

    return _write(key, "booking", number, make)


def order_meals(key: str, booking_ref: str, meals: int, amount: float) -> dict:
    """Order ``meals`` meals for ``amount`` on a booking (idempotent by ``key``)."""
    def make(ref, db):
        return {"ref": ref, "booking_ref": booking_ref, "meals": meals, "amount": amount, "status": "ordered"}

    return _write(key, "catering", "", make)


def by_key(key: str) -> dict | None:
    """What was written under idempotency key ``key``, or None: what a reconcile hook asks."""
    with _ledger() as db:
        found = db.execute("SELECT body FROM entry WHERE key = ?", (key,)).fetchone()
    return json.loads(found[0]) if found else None


def by_ref(ref: str) -> dict | None:
    """The booking or catering order ``ref`` (e.g. ``BK00001``), or None."""
    with _ledger() as db:
        found = db.execute("SELECT body FROM entry WHERE ref = ?", (ref,)).fetchone()
    return json.loads(found[0]) if found else None
