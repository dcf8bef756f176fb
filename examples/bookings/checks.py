"""The bookings app's completion check: was a seat booked?"""

from runs.engine.completion import Verdict, achieved, incomplete, not_achieved
from tools.models import ToolCallStatus as S


def trip_booked(run) -> Verdict:
    """Achieved once a booking succeeded; not achieved if booking was refused; else ask the model to go on.

    The floor (``runs.engine.completion``) still binds it: a failed side
    effect elsewhere in the run makes it ``not_achieved`` whatever this says.
    """
    bookings = run.tool_calls.filter(name="book_flight")
    if bookings.filter(status=S.SUCCEEDED).exists():
        return achieved()
    if bookings.filter(status__in=[S.DENIED, S.REJECTED, S.FAILED]).exists():
        return not_achieved("No seat could be booked.")
    return incomplete("No flight is booked yet: call book_flight, or explain why none fits.")
