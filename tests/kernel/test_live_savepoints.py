"""runs.live: what a rolled-back savepoint changed on an instance is not pushed as committed.

docs/design.md#live-pushes: "a run changed only there is not pushed, so no
client sees a state or a ``seq`` the database never held". A run changed
through the same instance both before a savepoint (kept) and inside it
(rolled back) is pushed as the database holds it: when work of the
transaction rolled back, the push reads the run back rather than trust the
instance, which holds what the savepoint undid (``runs.live._Pushes``). A
reviewer's test, failing before.
"""

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from runs.engine.lifecycle import start_run
from runs.live import run_group
from runs.models import Run, Step
from runs.services import set_phase
from runs.transitions import apply
from tests.support.durability import lookup_agent
from tests.support.live import listening

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(people):
    run = start_run(agent=lookup_agent(), user=people["requester"], input="look a up")
    apply(run.start, actor="worker")
    return run, Step.objects.create(run=run, index=0)


def test_a_run_changed_before_and_inside_a_rolled_back_savepoint_is_pushed_as_stored(running):
    run, _step = running
    layer = get_channel_layer()

    def kept_then_undone():
        with transaction.atomic():
            set_phase(run, "calling_model")  # kept: owes a push from this instance
            with pytest.raises(RuntimeError):
                with transaction.atomic():  # a savepoint
                    apply(run.wait, actor="worker", waiting_reason="approval")
                    raise RuntimeError("the writer gives up")
        return Run.objects.values_list("status", "last_event_seq").get(pk=run.pk)

    @async_to_sync
    async def scenario():
        updates = await listening(layer, run_group(run.pk))
        stored = await database_sync_to_async(kept_then_undone)()
        update = (await asyncio.wait_for(layer.receive(updates), 5))["run"]
        assert (update["status"], update["seq"]) == stored

    scenario()
