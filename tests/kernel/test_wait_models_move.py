"""Waits and external events moved from the runs app to the tools app (runs 0019, tools 0012) with their tables:
rows, ids and the right to deliver events survive the move both ways (docs/design.md#waits)."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from runs.models import Agent, Run, Session, Step
from tools.models import ExternalEvent, ToolCall, Wait

BEFORE = [("runs", "0018_waiting_reason_without_choices"), ("tools", "0011_mcp_tool_approval_rule")]


def _migrate(targets) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor


def test_a_wait_and_its_event_keep_their_rows_and_the_deliver_grant_across_the_move(transactional_db):
    sender = get_user_model().objects.create_user("gateway-bot")
    agent = Agent.objects.create(slug="mover", name="Mover", model={"provider": "scripted", "turns": []})
    run = Run.objects.create(session=Session.objects.create(owner=sender, agent=agent), agent=agent,
                             requested_by=sender, input="Wait for it.")
    call = ToolCall.objects.create(run=run, step=Step.objects.create(run=run, index=0), index=0,
                                   provider_call_id="c1", name="wait_for_event", arguments={})
    wait = Wait.objects.create(run=run, tool_call=call, kind="external_event", deadline=timezone.now()
                               + timedelta(hours=1), event_type="payment.settled", correlation_key="K1", status="done")
    event = ExternalEvent.objects.create(type="payment.settled", key="K1", payload={"ok": True}, run=run, wait=wait,
                                         received_by=sender)

    old = _migrate(BEFORE).loader.project_state(BEFORE).apps  # the models back in the runs app
    old_wait = old.get_model("runs", "Wait").objects.get(pk=wait.pk)
    assert (old_wait.kind, old_wait.correlation_key, old_wait.tool_call_id) == ("external_event", "K1", call.pk)
    assert old.get_model("runs", "ExternalEvent").objects.get(pk=event.pk).wait_id == wait.pk
    # An operator granted the right to deliver events while it was the runs app's.
    sender.user_permissions.add(Permission.objects.get(codename="add_externalevent", content_type__app_label="runs"))

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    moved = Wait.objects.get(pk=wait.pk)
    assert (moved.run_id, moved.kind, moved.status, moved.event_type) == (run.pk, "external_event", "done",
                                                                         "payment.settled")
    assert ExternalEvent.objects.get(pk=event.pk).payload == {"ok": True}
    assert Run.objects.get(pk=run.pk).waits.get() == moved
    sender = get_user_model().objects.get(pk=sender.pk)  # no cached permissions
    assert sender.has_perm("tools.add_externalevent") and not sender.has_perm("runs.add_externalevent")
    assert not Permission.objects.filter(content_type__app_label="runs", codename__endswith="externalevent").exists()
