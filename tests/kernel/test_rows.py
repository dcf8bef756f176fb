"""runs.base.rows writes a row as Model.save writes it (values, conversions, stamps, the optimistic lock).

Each insert is made twice, once by ``save()`` and once by ``rows.insert``,
with the same values, and the two stored rows are compared column by column
as the database holds them (the engine's hot path writes its rows the fast
way; anything else reads them back the ordinary way).
"""

import datetime
import uuid
from decimal import Decimal

import pytest
from django.db import DatabaseError, DataError, IntegrityError, connection, transaction
from django.utils import timezone
from django_fsm import ConcurrentTransition

from approvals.models import Interrupt, InterruptKind
from runs.base import rows
from runs.engine.lifecycle import start_run
from runs.models import IdempotentRequest, Message, Phase, Run, RunEvent, RunStatus, Step
from runs.services import set_phase
from tests.support.durability import lookup_agent
from tools.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db(transaction=True)

_STAMPED = {"created_at", "started_at", "updated_at", "received_at"}  # auto_now(_add): compared apart


@pytest.fixture
def run(people):
    return start_run(agent=lookup_agent(), user=people["requester"], input="look a up")


def _stored(model, pk) -> dict:
    """The row as the database gives it, by column, without the primary key."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {connection.ops.quote_name(model._meta.db_table)} WHERE id = %s", [pk])
        row = dict(zip([column[0] for column in cursor.description], cursor.fetchone()))
    del row["id"]
    return row


def _auto_stamped(model) -> list[str]:
    return [f.column for f in model._meta.concrete_fields if getattr(f, "auto_now", False) or
            getattr(f, "auto_now_add", False)]


def _both_ways(model, values: dict) -> tuple[dict, dict]:
    """The row ``model(**values)`` stored by ``save()`` and by ``rows.insert`` (each deleted again after)."""
    stored = []
    for write in (lambda instance: instance.save(), rows.insert):
        before = timezone.now()
        instance = model(**values)
        write(instance)
        assert instance.pk is not None and not instance._state.adding
        row = _stored(model, instance.pk)
        for column in _auto_stamped(model):  # stamped on the instance and in the row, now
            assert before <= getattr(instance, column) <= timezone.now()
            row.pop(column)
        stored.append(row)
        model._base_manager.filter(pk=instance.pk).delete()
    return stored[0], stored[1]


def _cases(run, people):
    step = Step.objects.create(run=run, index=9)
    user = people["requester"]
    when = timezone.now() - datetime.timedelta(hours=1)
    return {
        "step": (Step, dict(run=run, index=0, status=Step.Status.SUCCEEDED,
                            request={"messages": [{"role": "user", "content": "ünïcode ✓ \"quoted\""}], "n": 1.5},
                            response={}, input_tokens=3, cost_usd=Decimal("0.1234567"), error="",
                            finished_at=when)),
        "tool call": (ToolCall, dict(run=run, step=step, index=1, provider_call_id="call_1", name="lookup",
                                     raw_arguments='{"a": 1}', arguments=None, status=ToolCallStatus.READY,
                                     side_effect=True, duplicate_of=None, result=[1, None, {"x": []}],
                                     reconcile_after=None)),
        "message": (Message, dict(session_id=run.session_id, run=run, role="assistant", content="",
                                  tool_calls=[{"id": "c", "name": "t", "arguments": "{}"}], tool_call_id="")),
        "event": (RunEvent, dict(run=run, seq=77, type="transition", actor="worker", reason=Phase.CALLING_MODEL,
                                 payload={"k": [True, False, None]}, from_status=RunStatus.QUEUED,
                                 to_status=RunStatus.RUNNING)),
        "interrupt": (Interrupt, dict(run=run, tool_call=None, kind=InterruptKind.APPROVAL, title="Approve?",
                                      allow_requester=False, edited_arguments={"amount": 10}, expires_at=when)),
        "encoder": (IdempotentRequest, dict(user=user, scope="s", key="k", fingerprint="f", response_status=201,
                                            response_body={"at": when, "cost": Decimal("1.10"), "id": uuid.UUID(int=5)},
                                            started_at=when, expires_at=when)),
    }


@pytest.mark.parametrize("case", ["step", "tool call", "message", "event", "interrupt", "encoder"])
def test_an_insert_stores_what_save_stores(case, run, people):
    model, values = _cases(run, people)[case]
    saved, inserted = _both_ways(model, values)
    assert inserted == saved


@pytest.mark.parametrize("model, values", [
    (Message, {"role": True}),  # a CharField given a bool: save stores "True"
    (Message, {"role": 5}),  # ... given an int: "5"
    (Step, {"index": True}),  # an IntegerField given a bool: save stores 1
    (Step, {"index": "7"}),  # ... given a numeric string: 7
])
def test_a_plain_field_given_another_type_is_converted_as_save_converts_it(model, values, run):
    base = {"run": run, "session_id": run.session_id} if model is Message else {"run": run, "index": 0}
    saved, inserted = _both_ways(model, {**base, **values})
    assert inserted == saved


def test_an_integer_field_given_text_is_refused_before_the_database_as_save_refuses_it(run):
    with pytest.raises(ValueError):
        Step(run=run, index="x").save()
    with pytest.raises(ValueError):
        rows.insert(Step(run=run, index="x"))
    assert not Step.objects.filter(run=run).exists()


def test_an_update_writes_only_its_fields_and_stamps_auto_now(run):
    other = Run.objects.get(pk=run.pk)
    Run.objects.filter(pk=run.pk).update(error="written elsewhere")
    before = timezone.now()
    other.phase, other.final_output = Phase.CALLING_MODEL, "not written"
    assert rows.update(other, ["phase", "updated_at"]) == 1
    stored = Run.objects.get(pk=run.pk)
    assert (stored.phase, stored.final_output, stored.error) == (Phase.CALLING_MODEL, "", "written elsewhere")
    assert before <= other.updated_at == stored.updated_at


def test_update_row_refuses_a_row_whose_status_changed_since_it_was_loaded_as_save_does(run, people):
    step = Step.objects.create(run=run, index=0)
    for write in (lambda s: s.save(update_fields=["error"]), lambda s: s.update_row(["error"])):
        stale = Step.objects.get(pk=step.pk)
        Step.objects.filter(pk=step.pk).update(status=Step.Status.FAILED)
        stale.error = "stale"
        with pytest.raises(ConcurrentTransition):
            write(stale)
        assert Step.objects.get(pk=step.pk).error == ""
        Step.objects.filter(pk=step.pk).update(status=Step.Status.STARTED)


def test_update_row_of_a_deleted_row_raises_a_database_error_as_save_does(run):
    for write in (lambda s: s.save(update_fields=["error"]), lambda s: s.update_row(["error"])):
        step = Step.objects.create(run=run, index=0)
        Step.objects.filter(pk=step.pk).delete()
        step.error = "gone"
        with pytest.raises(DatabaseError):
            write(step)
        assert not Step.objects.filter(pk=step.pk).exists()


def test_update_row_writes_when_the_status_is_as_loaded_and_moves_the_lock_on(run):
    step = Step.objects.get(pk=Step.objects.create(run=run, index=0).pk)
    step.error = "first"
    step.update_row(["error"])
    step.error = "second"
    step.update_row(["error"])  # the lock compares with what this instance last wrote
    assert Step.objects.get(pk=step.pk).error == "second"


def test_the_run_counter_reads_the_stored_integer_and_a_missing_run_is_does_not_exist(run):
    Run.objects.filter(pk=run.pk).update(last_event_seq=41)
    seq = rows.counter(Run, "last_event_seq", run.pk)
    assert seq == 41 and type(seq) is int
    with pytest.raises(Run.DoesNotExist):
        rows.counter(Run, "last_event_seq", run.pk + 1000)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a data-modifying WITH: PostgreSQL only")
def test_a_numbered_insert_stores_what_save_stores_numbered_from_the_updated_counter_or_nothing(run):
    values = dict(run=run, type="transition", actor="worker", reason=Phase.CALLING_MODEL, payload={"k": [True, None]},
                  from_status=RunStatus.QUEUED, to_status=RunStatus.RUNNING)
    saved = RunEvent(seq=99, **values)
    saved.save()
    counter = Run.objects.get(pk=run.pk).last_event_seq
    events = [RunEvent(**values), RunEvent(**{**values, "reason": "second"})]

    refused = rows.update_and_insert_numbered(Run, run.pk, values={"phase": Phase.FINALIZING},
                                              increments={}, expected={"lease_token": -1},
                                              counted="last_event_seq", instances=events, position="seq")
    assert refused is None and all(event.pk is None for event in events)
    assert (Run.objects.get(pk=run.pk).last_event_seq, run.events.filter(reason="second").exists()) == (counter, False)

    last = rows.update_and_insert_numbered(Run, run.pk, values={"phase": Phase.FINALIZING},
                                           increments={}, expected={},
                                           counted="last_event_seq", instances=events, position="seq")
    assert last == counter + 2 and [event.seq for event in events] == [counter + 1, counter + 2]
    assert Run.objects.values_list("last_event_seq", "phase").get(pk=run.pk) == (counter + 2, Phase.FINALIZING)
    first, expected = _stored(RunEvent, events[0].pk), _stored(RunEvent, saved.pk)
    for row in (first, expected):
        row.pop("created_at"), row.pop("seq")
    assert first == expected
    assert _stored(RunEvent, events[1].pk)["reason"] == "second"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a data-modifying WITH: PostgreSQL only")
def test_extra_rows_go_in_with_the_numbered_ones_in_order_as_save_stores_them_or_not_at_all(run):
    event = dict(run=run, type="transition", actor="worker", reason="r")
    message = dict(session_id=run.session_id, run=run, role="tool", content="c", tool_calls=[{"id": "x"}],
                   tool_call_id="x")
    saved = Message(**message)
    saved.save()
    before = Message.objects.count()

    extra = [Message(**message), Message(**{**message, "content": "second"})]
    assert rows.update_and_insert_numbered(Run, run.pk, values={}, increments={}, expected={"lease_token": -1},
                                           counted="last_event_seq", instances=[RunEvent(**event)],
                                           position="seq", extra=extra) is None
    assert [m.pk for m in extra] == [None, None] and Message.objects.count() == before

    for count in (2, 1):  # two statements of two shapes, each built once
        events, extra = [RunEvent(**event)], [Message(**{**message, "content": f"m{n}"}) for n in range(count)]
        last = rows.update_and_insert_numbered(Run, run.pk, values={}, increments={}, expected={},
                                               counted="last_event_seq", instances=events, position="seq",
                                               extra=extra)
        assert last == events[0].seq and events[0].pk == run.events.get(seq=last).pk
        assert [m.content for m in Message.objects.filter(pk__in=[m.pk for m in extra]).order_by("pk")] == [
            m.content for m in extra]
        assert extra[0].pk < extra[-1].pk or count == 1  # in the order given
        assert not any(m._state.adding for m in extra)
    inserted, expected = _stored(Message, extra[0].pk), _stored(Message, saved.pk)
    for row in (inserted, expected):
        row.pop("created_at"), row.pop("content")
    assert inserted == expected
    with pytest.raises(TypeError):
        rows.update_and_insert_numbered(Run, run.pk, values={}, increments={}, expected={},
                                        counted="last_event_seq", instances=[RunEvent(**event)], position="seq",
                                        extra=[Message(**message), Step(run=run, index=1, status="started")])


def test_a_numbered_insert_refuses_a_caller_moving_its_counter(run):
    # The counter moves by the rows inserted; a caller adding to it too would number rows past it.
    for moved in ({"increments": {"last_event_seq": 2}, "values": {}},
                  {"increments": {}, "values": {"last_event_seq": 7}}):
        with pytest.raises(TypeError, match="last_event_seq"):
            rows.update_and_insert_numbered(Run, run.pk, expected={}, counted="last_event_seq", position="seq",
                                            instances=[RunEvent(run=run, type="t", actor="worker")], **moved)
    assert not run.events.filter(type="t").exists()


def test_update_and_update_columns_of_one_shape_are_two_statements_each_doing_its_own(run):
    # The same column set and fenced, once by update (a row count) and once by update_columns (RETURNING):
    # the statements they build and keep must not be taken for each other, in either order.
    stale = Run.objects.get(pk=run.pk)
    Run.objects.filter(pk=run.pk).update(last_event_seq=41)
    for _ in range(2):
        stale.phase = Phase.CALLING_MODEL
        assert rows.update(stale, ["phase"], expected={"status": RunStatus.QUEUED}) == 1
        assert Run.objects.values_list("phase", flat=True).get(pk=run.pk) == Phase.CALLING_MODEL
        assert rows.update_columns(Run, run.pk, values={"phase": Phase.FINALIZING}, increments={},
                                   expected={"status": RunStatus.QUEUED}, returning="last_event_seq") == 41
        assert Run.objects.values_list("phase", flat=True).get(pk=run.pk) == Phase.FINALIZING
    assert rows.update(stale, ["phase"], expected={"status": RunStatus.RUNNING}) == 0  # fenced: nothing written
    assert rows.update_columns(Run, run.pk, values={"phase": Phase.CALLING_MODEL}, increments={"last_event_seq": 1},
                               expected={"status": RunStatus.RUNNING}, returning="last_event_seq") is None
    assert Run.objects.values_list("phase", "last_event_seq").get(pk=run.pk) == (Phase.FINALIZING, 41)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a data-modifying WITH: PostgreSQL only")
def test_one_row_inserted_with_an_update_stores_what_save_stores_or_nothing(run):
    values = dict(run=run, index=4, status="started", request={"turn_index": 4}, input_tokens=0, output_tokens=0)
    saved = Step(**values)
    saved.save()
    refused = Step(**{**values, "index": 5})
    assert rows.update_and_insert_one(Run, run.pk, values={"phase": Phase.FINALIZING}, expected={"lease_token": -1},
                                      instance=refused) is False
    assert refused.pk is None and not run.steps.filter(index=5).exists()
    assert Run.objects.values_list("phase", flat=True).get(pk=run.pk) != Phase.FINALIZING

    step = Step(**{**values, "index": 5})
    assert rows.update_and_insert_one(Run, run.pk, values={"phase": Phase.FINALIZING}, expected={},
                                      instance=step) is True
    assert Run.objects.values_list("phase", flat=True).get(pk=run.pk) == Phase.FINALIZING
    inserted, expected = _stored(Step, step.pk), _stored(Step, saved.pk)
    for row in (inserted, expected):
        row.pop("started_at"), row.pop("index")
    assert inserted == expected


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a data-modifying WITH: PostgreSQL only")
def test_text_too_long_for_its_column_is_refused_by_the_combined_statements_as_save_refuses_it(run):
    too_long = "y" * (RunEvent._meta.get_field("type").max_length + 1)
    with pytest.raises(DataError), transaction.atomic():
        RunEvent(run=run, seq=99, type=too_long, actor="worker").save()
    with pytest.raises(DataError), transaction.atomic():
        rows.update_and_insert_numbered(Run, run.pk, values={}, increments={}, expected={},
                                        counted="last_event_seq", instances=[RunEvent(run=run, type=too_long,
                                                                                      actor="worker")],
                                        position="seq")
    with pytest.raises(DataError), transaction.atomic():
        rows.update_and_insert_one(Run, run.pk, values={"phase": Phase.FINALIZING}, expected={},
                                   instance=Message(session_id=run.session_id, run=run, role="y" * 100))
    assert not run.events.filter(type__startswith="yyy").exists()


def test_a_phase_whose_row_is_refused_leaves_the_run_instance_as_it_was(run):
    Step.objects.create(run=run, index=0, request={})
    mine = Run.objects.get(pk=run.pk)
    before = (mine.phase, mine.updated_at)
    with pytest.raises(IntegrityError), transaction.atomic():
        set_phase(mine, Phase.CALLING_MODEL, insert=Step(run=mine, index=0, request={}))  # index 0 is taken
    assert (mine.phase, mine.updated_at) == before
    assert Run.objects.values_list("phase", flat=True).get(pk=run.pk) == before[0]
