"""``start_at`` of POST /api/runs/ under attack: a time without its UTC offset is a 400, not read as UTC.

Found by attacking the API: ``"start_at": "2026-12-01T09:00:00"`` was
accepted and read in the server's zone (UTC), so a client meaning its own
09:00 got a run at another time, although the README asks for an offset
and ``submit_input`` refuses naive times (its check never saw one: DRF had
already made the time aware).
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run
from tests.support.api import field_errors
from tests.support.core import asking_agent
from tests.support.security import stored_state

pytestmark = pytest.mark.django_db(transaction=True)


def _later(hours: int = 2):
    return (timezone.now() + timedelta(hours=hours)).replace(microsecond=0)


@pytest.mark.parametrize("text", [_later().replace(tzinfo=None).isoformat(),
                                  _later().strftime("%Y-%m-%d %H:%M"), _later().strftime("%Y-%m-%dT%H:%M:%S.%f")])
def test_a_start_time_without_an_offset_is_400_and_starts_nothing(people, api, text):
    agent = asking_agent()
    before = stored_state()

    response = api(people["requester"]).post("/api/runs/", {"agent": agent.slug, "input": "Later.",
                                                          "start_at": text}, format="json")

    assert "UTC offset" in field_errors(response)["start_at"][0]
    assert stored_state() == before


@pytest.mark.parametrize("suffix, offset", [("Z", timedelta(0)), ("+08:00", timedelta(hours=8)),
                                            ("-05:30", timedelta(hours=-5, minutes=-30))])
def test_a_start_time_with_an_offset_is_that_instant(people, api, suffix, offset):
    instant = _later(12)
    local = (instant + offset).replace(tzinfo=None)

    response = api(people["requester"]).post("/api/runs/", {"agent": asking_agent().slug, "input": "Later.",
                                                          "start_at": local.isoformat() + suffix}, format="json")

    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])
    assert (run.status, run.waiting_reason, run.wake_at) == ("queued", "scheduled", instant)
