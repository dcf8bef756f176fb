"""The bookings service of the HTTP tools' tests (``tools.http``): a real service on loopback
(``tests/support/fakes/tool_service.py``) verifying every request's signature, its endpoint profile, and the
tools and runs that call it.

* ``service`` (a fixture): the running ``ToolService``, profile ``bookings`` (loopback trusted, plain http),
  its secret in ``SECRET_ENV``;
* ``find_rooms(monkeypatch)`` (read-only, ``POST /tools/rooms``) / ``book_room(monkeypatch)`` (side effect,
  approval ``always``, ``POST /tools/book``, reconciled at ``/tools/lookup``): HTTP tools registered for
  one test (``use``);
* ``book_room_env(settings)``: the environment declaring ``book_room`` to another process;
* ``booking_agent()`` / ``booking_run(people)``: an agent (a run of it) that looks for rooms, books room 4
  for 1 September, then answers.
"""

import base64
import json

import pytest

from runs.engine.lifecycle import start_run
from tests.support.durability import make_agent
from tests.support.fakes.tool_service import ToolService
from tools import registry
from tools.http import http_tool

SECRET = "whsec_" + base64.b64encode(b"the bookings service's signing key!").decode()
SECRET_ENV = "BOOKINGS_TOOLS_SECRET"
NIGHT = {"type": "object", "properties": {"night": {"type": "string"}}, "required": ["night"],
         "additionalProperties": False}
ROOM = {"type": "object", "properties": {"room": {"type": "integer"}, "night": {"type": "string"}},
        "required": ["room", "night"], "additionalProperties": False}
BOOKING = {"type": "object", "required": ["booking", "room"]}


@pytest.fixture
def service(settings, monkeypatch):
    """The bookings service, its profile ``bookings`` (loopback trusted, plain http) and its secret set."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    running = ToolService(SECRET, slow_s=1.5)
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_BACKOFF_S": 0.05, "TOOL_ENDPOINTS": {"bookings": {
        "base_url": running.base_url, "secret_env": SECRET_ENV, "allowed_hosts": ["127.0.0.1"], "allow_http": True,
        "max_response_bytes": 100_000}}}
    yield running
    running.close()


def use(monkeypatch, **arguments):
    """Register ``http_tool(**arguments)`` for this test only."""
    tool = http_tool(endpoint="bookings", **arguments)
    monkeypatch.setitem(registry._TOOLS, tool.name, tool)
    return tool


def find_rooms(monkeypatch, **fields):
    return use(monkeypatch, name="find_rooms", description="Free rooms on a night.", parameters=NIGHT,
               path="/tools/rooms", **fields)


def book_room(monkeypatch, **fields):
    fields = {"approval": "always", "result_schema": BOOKING, **fields}
    return use(monkeypatch, name="book_room", description="Book a room.", parameters=ROOM, path="/tools/book",
               side_effect=True, reconcile_path="/tools/lookup", **fields)


def booking_agent(*, find=True):
    """The scripted agent ``booker``: looks for rooms (when ``find``), books room 4, then answers."""
    turns = ([{"tool_calls": [{"name": "find_rooms", "arguments": {"night": "2026-09-01"}}]}] if find else []) + [
        {"tool_calls": [{"name": "book_room", "arguments": {"room": 4, "night": "2026-09-01"}}]},
        {"content": "Booked."}]
    return make_agent("booker", turns, tools=["find_rooms", "book_room"])


def booking_run(people, *, find=True):
    """A run of ``booking_agent(find=find)`` for the requester."""
    return start_run(agent=booking_agent(find=find), user=people["requester"], input="Book me a room for 1 September.")


def book_room_env(settings, **fields) -> dict:
    """The environment that declares ``book_room`` (its base fields and ``fields``) to another process through
    ``TOLLGATE_HTTP_TOOLS``, with this test's ``bookings`` profile (``settings``) and its secret."""
    declared = [{"name": "book_room", "description": "Book a room.", "endpoint": "bookings", "path": "/tools/book",
                 "parameters": ROOM, "side_effect": True, "reconcile_path": "/tools/lookup", "result_schema": BOOKING,
                 **fields}]
    return {SECRET_ENV: SECRET, "TOLLGATE_TOOL_ENDPOINTS": json.dumps(settings.TOLLGATE["TOOL_ENDPOINTS"]),
            "TOLLGATE_HTTP_TOOLS": json.dumps(declared)}
