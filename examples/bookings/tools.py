"""The bookings app's tools: what the model may call, and the rules around each call.

* ``find_flights``: read-only, a plain function (run in the tool thread pool).
* ``book_flight``: a side effect, an ``async def`` handler. The backend
  deduplicates by Tollgate's idempotency key; ``reconcile`` asks it what
  became of a call whose outcome is unknown (a timeout, a crash).
* ``order_catering``: a side effect a person approves above 200.00; its
  precondition checks the booking is the requester's.
"""

from runs.base.awaiting import run_blocking
from tools.registry import Reconciliation, Tool, ToolContext, ToolError

from examples.bookings import backend

AIRPORT = {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA airport code, e.g. BKK."}
FLIGHT = {"type": "string", "pattern": "^[A-Z]{2}[0-9]{1,4}$", "description": "Flight number, e.g. TG640."}


# --- find_flights: read-only, sync --------------------------------------------

def find_flights(ctx: ToolContext, args: dict) -> dict:
    return {"flights": backend.search(args["origin"], args["destination"], args["date"])}


FIND_FLIGHTS = Tool(
    name="find_flights",
    description="List the flights between two airports on a date, with fares and seats left.",
    parameters={"type": "object",
                "properties": {"origin": AIRPORT, "destination": AIRPORT,
                               "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}},
                "required": ["origin", "destination", "date"], "additionalProperties": False},
    handler=find_flights,
    timeout_s=5,
)


# --- book_flight: side effect, async, idempotency key, reconcile hook ---------

def seat_left(ctx: ToolContext, args: dict) -> str | None:
    """The precondition: a reason to refuse the call, or None."""
    found = backend.flight(args["flight"])
    if found is None:
        return f"There is no flight {args['flight']}."
    if found["seats_left"] < 1:
        return f"Flight {args['flight']} is full."
    return None


async def book_flight(ctx: ToolContext, args: dict) -> dict:
    # A real airline API would be awaited here (httpx.AsyncClient); the fake
    # backend is a file, so its blocking call goes to the sync pool.
    try:
        return await run_blocking(backend.book, ctx.idempotency_key, args["flight"], args["passenger"],
                                  ctx.user.get_username())
    except backend.SoldOut as exc:
        raise ToolError(str(exc)) from exc  # nothing was booked: the model is told, the call is failed


def find_booking(idempotency_key: str) -> Reconciliation:
    """The reconcile hook: did the call with this key book a seat?"""
    booking = backend.by_key(idempotency_key)
    if booking is None:
        return Reconciliation("not_found")
    return Reconciliation("succeeded", result=booking)


def one_seat_per_passenger(ctx: ToolContext, args: dict) -> str:
    """``same_action``: a customer books a passenger onto a flight once, in any session."""
    return f"{ctx.user.pk}/{args['flight']}/{args['passenger'].casefold()}"


BOOK_FLIGHT = Tool(
    name="book_flight",
    description="Book one seat on a flight for a passenger. Returns the booking reference.",
    parameters={"type": "object",
                "properties": {"flight": FLIGHT, "passenger": {"type": "string", "minLength": 1, "maxLength": 100}},
                "required": ["flight", "passenger"], "additionalProperties": False},
    handler=book_flight,
    side_effect=True,
    precondition=seat_left,
    target_key="flight",
    same_action=one_seat_per_passenger,
    idempotent=True,
    reconcile=find_booking,
    timeout_s=10,
)


# --- order_catering: side effect, approval above 200, precondition -------------

def booking_is_theirs(ctx: ToolContext, args: dict) -> str | None:
    booking = backend.by_ref(args["booking_ref"])
    if booking is None or booking.get("customer") != ctx.user.get_username():
        return f"{args['booking_ref']} is not a booking of this customer."
    return None


def order_catering(ctx: ToolContext, args: dict) -> dict:
    return backend.order_meals(ctx.idempotency_key, args["booking_ref"], args["meals"], args["amount"])


ORDER_CATERING = Tool(
    name="order_catering",
    description="Order meals for a booked flight; amount is the total price in EUR.",
    parameters={"type": "object",
                "properties": {"booking_ref": {"type": "string", "pattern": "^BK[0-9]{5}$"},
                               "meals": {"type": "integer", "minimum": 1, "maximum": 20},
                               "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 5000}},
                "required": ["booking_ref", "meals", "amount"], "additionalProperties": False},
    handler=order_catering,
    side_effect=True,
    approval="amount > 200",
    precondition=booking_is_theirs,
)

TOOLS = (FIND_FLIGHTS, BOOK_FLIGHT, ORDER_CATERING)
