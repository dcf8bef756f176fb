"""Logs carry the run (issue 25): the lines of a run, the engine's and its tools' own, name its run, session and
tool call; a JSON format is one setting away.

Through a real booking run in a real worker: the engine's lines, and the
HTTP tool's client's (httpx, inside the book_room tool's handler on the
engine's event loop, to the bookings service of ``tests.support.bookings``),
are read from the console handler the settings configure.
"""

import io
import json
import logging
import logging.config
import os
import subprocess
import sys

import pytest
from django.conf import settings

from approvals.services import decide_interrupt
from runs.engine.lifecycle import start_run
from runs.base.log_context import RunContextFilter, logging_settings
from runs.models import RunStatus
from tests.support.bookings import book_room, booking_run, find_rooms, service  # noqa: F401  (service: a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def console():
    """``(text lines, JSON lines)``: what the settings' console handler writes (text, the default) and what the
    JSON format would write, at DEBUG, while the test runs."""
    root = logging.getLogger()
    handler = next(h for h in root.handlers if any(isinstance(f, RunContextFilter) for f in h.filters))
    text, as_json = io.StringIO(), io.StringIO()
    configurator = logging.config.DictConfigurator(logging_settings("json", "DEBUG"))
    json_handler = logging.StreamHandler(as_json)
    json_handler.setFormatter(configurator.configure_formatter(configurator.config["formatters"]["json"]))
    json_handler.addFilter(RunContextFilter())
    previous_stream, previous_level = handler.setStream(text), root.level
    root.setLevel(logging.DEBUG)
    root.addHandler(json_handler)
    try:
        yield text, as_json
    finally:
        root.removeHandler(json_handler)
        root.setLevel(previous_level)
        handler.setStream(previous_stream)


def test_the_lines_of_a_run_carry_its_run_session_and_tool_call(service, console, people, worker, monkeypatch):
    find_rooms(monkeypatch)
    book_room(monkeypatch)
    text, as_json = console
    run = booking_run(people)
    worker.drain()
    run.refresh_from_db()
    decide_interrupt(interrupt=run.interrupts.get(), user=people["approver"], decision="approved")
    worker.drain()
    logging.getLogger("tests.elsewhere").warning("a line about no run")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    booking = run.tool_calls.get(name="book_room")

    lines = text.getvalue().splitlines()
    ids = f"[run {run.pk} session {run.session_id}]"
    assert any(line.startswith("model call of step 0:") and line.endswith(ids) for line in lines), lines
    with_call = f"[run {run.pk} session {run.session_id} tool_call {booking.pk}]"
    assert any(line.startswith(f"tool call {booking.pk} (book_room): executing") and line.endswith(with_call)
               for line in lines)
    # The book_room tool's own HTTP request to the bookings service, logged by httpx inside its handler.
    assert any(line.startswith("HTTP Request: POST") and "/tools/book" in line and line.endswith(with_call)
               for line in lines)
    assert "a line about no run" in lines  # outside a run: nothing added

    records = [json.loads(line) for line in as_json.getvalue().splitlines()]
    bookings = [r for r in records if r["logger"] == "httpx" and r["message"].startswith("HTTP Request: POST")
                and "/tools/book" in r["message"]]
    assert bookings and all((r["run_id"], r["session_id"], r["tool_call_id"]) == (run.pk, run.session_id, booking.pk)
                            for r in bookings)
    engine = [r for r in records if r["logger"] == "runs.engine.loop" and r["message"].startswith("model call")]
    assert len(engine) == 3 and {(r["run_id"], r["session_id"], r["tool_call_id"]) for r in engine} == {
        (run.pk, run.session_id, None)}
    assert {"time", "level", "logger", "message"} <= set(engine[0])
    elsewhere = next(r for r in records if r["message"] == "a line about no run")
    assert (elsewhere["run_id"], elsewhere["session_id"], elsewhere["tool_call_id"]) == (None, None, None)


def _log_one_line(env: dict) -> subprocess.CompletedProcess:
    code = ("import django, logging; django.setup(); from runs.base import log_context\n"
            "with log_context.bound(7, session_id=3):\n    logging.getLogger('tollgate.test').warning('hello')\n")
    return subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env})


def test_json_is_one_setting_away():
    plain = _log_one_line({})
    assert plain.stderr.strip() == "hello [run 7 session 3]"
    as_json = json.loads(_log_one_line({"TOLLGATE_LOG_FORMAT": "json"}).stderr)
    assert {key: as_json[key] for key in ("level", "logger", "message", "run_id", "session_id", "tool_call_id")} == {
        "level": "WARNING", "logger": "tollgate.test", "message": "hello", "run_id": 7, "session_id": 3,
        "tool_call_id": None}
    wrong = _log_one_line({"TOLLGATE_LOG_FORMAT": "xml"})
    assert wrong.returncode != 0 and "TOLLGATE_LOG_FORMAT must be one of text, json" in wrong.stderr
