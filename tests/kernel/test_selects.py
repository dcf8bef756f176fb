"""runs.base.selects reads rows as the ORM reads them (values, conversions, related rows, flags, locks).

Each read is made twice, once through a queryset and once through
``selects``, and the instances are compared field by field, on both
databases (the engine's hot path reads its rows the fast way; the rest of
the code, the ORM way).
"""

from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.base import selects
from runs.engine.lifecycle import start_run
from runs.models import Message, Run, Step
from tests.support.durability import lookup_agent
from tools.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)


def _fields(instance) -> dict:
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}


@pytest.fixture
def run(people):
    run = start_run(agent=lookup_agent(), user=people["requester"], input="look a up")
    # Values of every kind the engine converts: a decimal, a datetime, text (and the agent's JSON).
    Run.objects.filter(pk=run.pk).update(cost_usd=Decimal("0.001234"), wake_at=timezone.now(),
                                         final_output="ü\U0001F600 done")
    return run


def test_a_row_with_its_related_rows_is_read_as_select_related_reads_it(run):
    orm = Run.objects.select_related("agent", "session", "requested_by").get(pk=run.pk)
    with CaptureQueriesContext(connection) as queries:
        fast = selects.select_one(Run, {"pk": run.pk}, related=("agent", "session", "requested_by"))
        assert fast.agent.model == orm.agent.model and fast.requested_by.username == "requester"
    assert len(queries) == 1  # the related rows came with it
    assert _fields(fast) == _fields(orm)
    for name in ("agent", "session", "requested_by"):
        assert _fields(getattr(fast, name)) == _fields(getattr(orm, name))
    assert isinstance(fast.cost_usd, Decimal) and fast.final_output == "ü\U0001F600 done"
    assert isinstance(fast.agent.model, dict) and fast.agent.model == orm.agent.model
    assert fast.wake_at.tzinfo is not None
    assert fast._state.adding is False and fast._state.db == "default"


def test_an_empty_nullable_key_reads_as_none_and_a_filled_one_as_its_row(run, people):
    retry = start_run(agent=run.agent, user=people["requester"], input="again")
    Run.objects.filter(pk=retry.pk).update(retry_of=run)
    first = selects.select_one(Run, {"pk": run.pk}, related=("retry_of",))
    second = selects.select_one(Run, {"pk": retry.pk}, related=("retry_of",))
    with CaptureQueriesContext(connection) as queries:
        assert first.retry_of is None
        assert second.retry_of.pk == run.pk and second.retry_of.input == "look a up"
    assert len(queries) == 0


def test_a_flag_says_whether_a_matching_row_of_another_model_exists(run):
    flags = {"steps_in_flight": (Step, "run", {"status": Step.Status.STARTED})}
    assert selects.select_one(Run, {"pk": run.pk}, flags=flags).steps_in_flight is False
    Step.objects.create(run=run, index=0, status=Step.Status.STARTED)
    assert selects.select_one(Run, {"pk": run.pk}, flags=flags).steps_in_flight is True
    Step.objects.filter(run=run).update(status=Step.Status.SUCCEEDED)
    assert selects.select_one(Run, {"pk": run.pk}, flags=flags).steps_in_flight is False


def test_rows_come_in_order_with_the_attached_instance_cached(run):
    step = Step.objects.create(run=run, index=0)
    for index in (2, 0, 1):
        ToolCall.objects.create(run=run, step=step, index=index, provider_call_id=f"c{index}", name="fake_lookup",
                                arguments={"key": str(index)})
    orm = list(run.tool_calls.order_by("id"))
    with CaptureQueriesContext(connection) as queries:
        fast = selects.select(ToolCall, {"run": run.pk}, order_by="id", attach={"run": run})
        assert all(call.run is run for call in fast)
    assert len(queries) == 1
    assert [_fields(call) for call in fast] == [_fields(call) for call in orm]
    assert [call.index for call in fast] == [2, 0, 1]
    assert selects.select(ToolCall, {"run": run.pk, "name": "nothing"}) == []


def test_a_session_history_reads_as_the_orm_reads_it(run):
    for content in ("one", "two"):
        Message.objects.create(session=run.session, run=run, role="user", content=content)
    orm = list(Message.objects.filter(session_id=run.session_id).order_by("id"))
    fast = selects.select(Message, {"session": run.session_id}, order_by="id")
    assert [_fields(m) for m in fast] == [_fields(m) for m in orm] and len(fast) >= 2


def test_one_row_or_an_error(run):
    with pytest.raises(Run.DoesNotExist):
        selects.select_one(Run, {"pk": run.pk + 1000})
    with pytest.raises(TypeError):  # '= NULL' would match nothing where the ORM's filter reads IS NULL
        selects.select(Run, {"retry_of": None})
    start_run(agent=run.agent, user=run.requested_by, input="a second")
    with pytest.raises(Run.MultipleObjectsReturned):
        selects.select_one(Run, {"agent": run.agent_id})


def test_a_locking_read_needs_a_transaction_and_locks_inside_one(run):
    with pytest.raises(TransactionManagementError):
        selects.select_one(Run, {"pk": run.pk}, for_update=True)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = selects.select_one(Run, {"pk": run.pk}, related=("agent",), for_update=True)
    assert locked.pk == run.pk and locked.agent.pk == run.agent_id
    if connection.vendor == "postgresql":  # only the run is locked, not its agent
        assert queries[0]["sql"].endswith("FOR UPDATE OF t0")


def test_a_reverse_one_to_one_reads_along_and_a_sibling_flag_sees_only_other_rows(people):
    from django.db.models import Exists, OuterRef

    from approvals.models import AnswerFile, Interrupt, InterruptStatus
    from tests.support.core import pending_transfer

    item = pending_transfer(requester=people["requester"])
    pending = {"others_pending": (Interrupt, selects.Sharing("run"), {"status": InterruptStatus.PENDING})}

    def orm_flag(pk):
        return Interrupt.objects.annotate(others_pending=Exists(Interrupt.objects.filter(
            run_id=OuterRef("run_id"), status=InterruptStatus.PENDING).exclude(pk=OuterRef("pk")))).get(pk=pk)

    with CaptureQueriesContext(connection) as queries:
        alone = selects.select_one(Interrupt, {"pk": item.pk}, related=("tool_call", "answer_file"), flags=pending)
        assert alone.others_pending is False and alone.tool_call.pk == item.tool_call_id
        with pytest.raises(AnswerFile.DoesNotExist):  # none: known without a query, as select_related knows it
            alone.answer_file
    assert len(queries) == 1
    assert _fields(alone) == _fields(Interrupt.objects.get(pk=item.pk))

    second = Interrupt.objects.create(run=item.run, kind="input", title="a question")
    AnswerFile.objects.create(interrupt=second, file="answers/x", name="x.txt", content_type="text/plain", size=1,
                              sha256="0" * 64, uploaded_by=people["requester"])
    for pk in (item.pk, second.pk):
        fast = selects.select_one(Interrupt, {"pk": pk}, related=("answer_file",), flags=pending)
        assert fast.others_pending is orm_flag(pk).others_pending is True
    fast = selects.select_one(Interrupt, {"pk": second.pk}, related=("answer_file",))
    with CaptureQueriesContext(connection) as queries:
        assert fast.answer_file.name == "x.txt" and fast.answer_file.interrupt is fast
    assert len(queries) == 0
    Interrupt.objects.filter(pk=second.pk).update(status=InterruptStatus.RESOLVED)
    assert selects.select_one(Interrupt, {"pk": item.pk}, flags=pending).others_pending is False


def test_a_shape_with_flags_or_a_reverse_one_to_one_is_built_once(people):
    """The statement of a shape is kept under the shape's own key, flags and reverse one-to-ones too (a loop
    variable once overwrote the key, so such shapes were built again on every read)."""
    from approvals.models import Interrupt, InterruptStatus
    from tests.support.core import pending_transfer

    item = pending_transfer(requester=people["requester"])
    pending = {"others_pending": (Interrupt, selects.Sharing("run"), {"status": InterruptStatus.PENDING})}
    for options in ({"related": ("tool_call", "answer_file")}, {"flags": pending},
                    {"related": ("answer_file",), "flags": pending}):
        selects.select_one(Interrupt, {"pk": item.pk}, **options)
        kept = dict(selects._SELECTS)
        selects.select_one(Interrupt, {"pk": item.pk}, **options)
        assert selects._SELECTS == kept and all(shape is kept[key] for key, shape in selects._SELECTS.items())


def test_values_of_one_row_read_as_values_list_reads_them(run):
    """``values_one``: the ORM's ``values_list(...).get()`` values (a datetime, a decimal, an integer, a None),
    in the order named; the errors of ``get``; a locking read only inside a transaction."""
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
    for fields in (("cancel_requested_at", "last_event_seq"), ("cost_usd", "wake_at", "final_output", "outcome"),
                   ("last_event_seq", "cancel_requested_at")):
        orm = Run.objects.filter(pk=run.pk).values_list(*fields).get()
        assert selects.values_one(Run, {"pk": run.pk}, fields) == orm
        assert [type(value) for value in selects.values_one(Run, {"pk": run.pk}, fields)] == [type(v) for v in orm]
    with pytest.raises(Run.DoesNotExist):
        selects.values_one(Run, {"pk": run.pk + 1000}, ("last_event_seq",))
    Run.objects.create(agent=run.agent, session=run.session, requested_by=run.requested_by, input="again")
    with pytest.raises(Run.MultipleObjectsReturned):
        selects.values_one(Run, {"session": run.session_id}, ("last_event_seq",))
    with pytest.raises(TransactionManagementError):
        selects.values_one(Run, {"pk": run.pk}, ("last_event_seq",), for_update=True)
    with transaction.atomic():
        assert selects.values_one(Run, {"pk": run.pk}, ("last_event_seq",), for_update=True) == (run.last_event_seq,)


def test_pk_names_the_primary_key_wherever_a_field_name_is_taken(run):
    """``"pk"`` as the ORM reads it: among ``values_one``'s fields, as ``order_by``, in a flag's values (and in
    ``where``, as before), the same answers as the queryset's."""
    fields = ("pk", "last_event_seq")
    assert selects.values_one(Run, {"pk": run.pk}, fields) == Run.objects.filter(pk=run.pk).values_list(*fields).get()
    assert selects.values_one(Run, {"pk": run.pk}, ("pk",)) == (run.pk,)
    step = Step.objects.create(run=run, index=0)
    for index in (2, 0, 1):
        ToolCall.objects.create(run=run, step=step, index=index, provider_call_id=f"c{index}", name="fake_lookup",
                                arguments={"key": str(index)})
    fast = selects.select(ToolCall, {"run": run.pk}, order_by="pk")
    assert [call.pk for call in fast] == list(run.tool_calls.order_by("pk").values_list("pk", flat=True))
    assert [call.index for call in fast] == [2, 0, 1]
    for pk, there in ((step.pk, True), (step.pk + 1000, False)):
        flags = {"has_step": (Step, "run", {"pk": pk})}
        assert selects.select_one(Run, {"pk": run.pk}, flags=flags).has_step is there


def test_exists_and_count_answer_as_the_orm_answers(run):
    """``exists`` and ``count``: ``filter(**where).exists()`` and ``.count()``, a boolean and a str enum among the
    values (SQLite stores a boolean as an integer), no row as well as several."""
    from runs.webhooks.models import WebhookSubscription

    assert selects.exists(WebhookSubscription, {"active": True}) is False
    WebhookSubscription.objects.create(owner=run.requested_by, url="https://hooks.example.test/in",
                                       event_types=["run.failed"], secret="whsec_test", active=False)
    assert selects.exists(WebhookSubscription, {"active": True}) is False
    assert selects.exists(WebhookSubscription, {"active": False}) is True
    WebhookSubscription.objects.update(active=True)
    assert selects.exists(WebhookSubscription, {"active": True}) is True
    for index in range(2):
        Step.objects.create(run=run, index=index)
    for where in ({"run": run.pk}, {"run": run.pk, "status": Step.Status.STARTED}, {"run": run.pk, "index": 1},
                  {"run": run.pk, "status": Step.Status.FAILED}, {"run": run.pk + 1000}):
        assert selects.exists(Step, where) is Step.objects.filter(**where).exists()
        assert selects.count(Step, where) == Step.objects.filter(**where).count()
    with pytest.raises(TypeError):
        selects.exists(Step, {"run": run.pk, "finished_at": None})


def test_lookups_exclude_and_a_descending_order_read_as_the_orm_reads_them(run, people):
    """``__in``, ``__lt``, ``__lte``, ``__gt``, ``__gte``, ``exclude`` and ``order_by="-name"``: the rows, counts and
    answers of the ORM's ``filter``/``exclude``/``order_by``, an empty ``__in`` included; a lookup the module does
    not know, and an ``exclude`` on a nullable field, are refused."""
    for index, status in enumerate((Step.Status.STARTED, Step.Status.SUCCEEDED, Step.Status.FAILED,
                                    Step.Status.SUCCEEDED)):
        Step.objects.create(run=run, index=index, status=status)
    cases = [
        ({"run": run.pk, "status__in": [Step.Status.SUCCEEDED, Step.Status.FAILED]}, None),
        ({"run": run.pk, "status__in": ()}, None),
        ({"run": run.pk, "index__lt": 2}, None),
        ({"run": run.pk, "index__lte": 2, "index__gt": 0}, None),
        ({"run": run.pk, "index__gte": 3}, None),
        ({"run": run.pk}, {"status__in": {Step.Status.SUCCEEDED}}),
        ({"run": run.pk}, {"status": Step.Status.SUCCEEDED, "index__gt": 1}),
        ({"run": run.pk}, {"status__in": []}),
    ]
    for where, exclude in cases:
        orm = Step.objects.filter(**where).exclude(**(exclude or {}))
        fast = selects.select(Step, where, exclude=exclude, order_by="-index")
        assert [_fields(step) for step in fast] == [_fields(step) for step in orm.order_by("-index")]
        assert selects.exists(Step, where, exclude=exclude) is orm.exists()
    assert [step.index for step in selects.select(Step, {"run": run.pk}, order_by="index")] == [0, 1, 2, 3]
    with pytest.raises(TypeError):
        selects.select(Step, {"run": run.pk, "index__startswith": 1})
    with pytest.raises(TypeError):
        selects.exists(Step, {"run": run.pk}, exclude={"finished_at__lt": timezone.now()})
    with pytest.raises(TypeError):
        selects.exists(Step, {"run": run.pk, "status__in": [None]})


def test_a_foreign_keys_field_and_values_read_as_the_orm_reads_them(run, people):
    """``"run__session"`` (a field of the row a foreign key points at) in ``where``, and ``values`` of many rows
    with their conversions: what ``filter(...).values_list(...)`` gives; such a key's other lookups, and
    its use in ``exclude``, are refused."""
    other = start_run(agent=run.agent, user=people["requester"], input="elsewhere")
    for owner, index in ((run, 0), (run, 1), (other, 0)):
        Step.objects.create(run=owner, index=index, cost_usd=Decimal("0.5") * (index + 1))
    for where in ({"run__session": run.session_id}, {"run__session_id": other.session_id},
                  {"run__session": run.session_id, "index": 1}, {"run__status": "queued"}):
        orm = Step.objects.filter(**where).order_by("-id").values_list("id", "cost_usd", "started_at")
        assert selects.values(Step, where, ("pk", "cost_usd", "started_at"), order_by="-id") == list(orm)
        assert selects.exists(Step, where) is Step.objects.filter(**where).exists()
    assert [step.pk for step in selects.select(Step, {"run__session": other.session_id})] == [
        step.pk for step in Step.objects.filter(run__session=other.session_id)]
    assert selects.first_value(Step, {"run": run.pk}, "index", order_by="-index") == 1
    assert selects.first_value(Step, {"run": run.pk + 1000}, "index", order_by="index") is None
    with pytest.raises(TypeError):
        selects.values(Step, {"run__session__in": [run.session_id]}, ("pk",))
    with pytest.raises(TypeError):
        selects.exists(Step, {"run": run.pk}, exclude={"run__session": run.session_id})


def test_a_relation_of_a_related_row_reads_along_as_select_related_reads_it(run, people):
    """``related=("run", "run__agent", ...)``: the rows of two levels in one statement, cached where
    ``select_related`` caches them; a missing row on the way leaves what lies behind it unread (None)."""
    step = Step.objects.create(run=run, index=0)
    orm = Step.objects.select_related("run__agent", "run__requested_by", "run__retry_of").get(pk=step.pk)
    with CaptureQueriesContext(connection) as queries:
        fast = selects.select_one(Step, {"pk": step.pk},
                                  related=("run", "run__agent", "run__requested_by", "run__retry_of",
                                           "run__retry_of__agent"))
        assert fast.run.agent.slug == orm.run.agent.slug and fast.run.requested_by.username == "requester"
        assert fast.run.retry_of is None
    assert len(queries) == 1
    assert _fields(fast.run) == _fields(orm.run) and _fields(fast.run.agent) == _fields(orm.run.agent)
    retry = start_run(agent=run.agent, user=people["requester"], input="again")
    Run.objects.filter(pk=retry.pk).update(retry_of=run)
    again = Step.objects.create(run=retry, index=0)
    with CaptureQueriesContext(connection) as queries:
        fast = selects.select_one(Step, {"pk": again.pk}, related=("run", "run__retry_of", "run__retry_of__agent"))
        assert fast.run.retry_of.pk == run.pk and fast.run.retry_of.agent.slug == run.agent.slug
    assert len(queries) == 1
    with pytest.raises(TypeError):
        selects.select(Step, {"pk": step.pk}, related=("run__agent",))


def test_an_order_by_a_foreign_key_is_refused_where_the_orm_would_follow_the_related_models_ordering(run):
    """The ORM orders by a foreign key through the related model's ``Meta.ordering`` (a run: newest ``created_at``
    first), not by the key's column; selects refuse such an order rather than give another one (review)."""
    Step.objects.create(run=run, index=0)
    for read in (lambda: selects.values(Step, {"index": 0}, ("pk",), order_by="run"),
                 lambda: selects.first_value(Step, {"index": 0}, "pk", order_by="-run"),
                 lambda: selects.select(Step, {"index": 0}, order_by=("index", "run"))):
        with pytest.raises(TypeError, match="relation 'run'"):
            read()


def test_an_unknown_lookup_after_a_foreign_key_is_refused_with_a_type_error(run):
    """``_where``'s docstring: "Raises ``TypeError`` for ... an unknown lookup". After a foreign key's name, a lookup
    the module does not know (``isnull``, ``startswith``: both the ORM's) is taken for a field of the related row
    and raises ``FieldDoesNotExist`` instead (after any other field's name it is a ``TypeError``)."""
    with pytest.raises(TypeError):
        selects.exists(Step, {"index__isnull": False})
    for where in ({"run__isnull": False}, {"run__startswith": "1"}):
        with pytest.raises(TypeError):
            selects.exists(Step, where)
