"""runs.base.selects: a flag's conditions are read as the ORM's filter reads them, and a locking read locks.

A flag's condition values are prepared for the database as ``where``'s are
(``get_db_prep_value``: an aware datetime on SQLite is compared in the text
form Django stores), and a None is refused (``= NULL`` would match nothing
where the ORM's filter reads ``IS NULL``). A reviewer's tests, both failing
before those two fixes.
"""

import pytest
from django.db.models import Exists, OuterRef

from runs.base import selects
from runs.engine.lifecycle import start_run
from runs.models import Run, Step
from tests.support.durability import lookup_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def step(people):
    run = start_run(agent=lookup_agent(), user=people["requester"], input="look a up")
    return Step.objects.create(run=run, index=0)  # finished_at left NULL, started_at set


def _orm_flag(step, conditions: dict) -> bool:
    return Run.objects.annotate(
        flag=Exists(Step.objects.filter(run=OuterRef("pk"), **conditions))).get(pk=step.run_id).flag


def _fast_flag(step, conditions: dict) -> bool:
    return selects.select_one(Run, {"pk": step.run_id}, flags={"flag": (Step, "run", conditions)}).flag


def test_a_flag_on_an_empty_column_is_the_orms_answer_or_refused(step):
    assert _orm_flag(step, {"finished_at": None}) is True
    try:
        fast = _fast_flag(step, {"finished_at": None})
    except TypeError:  # refused, as a None in ``where`` is
        return
    assert fast is True, "'= NULL' matched nothing where the ORM's IS NULL matches the step"


def test_a_flag_on_a_datetime_is_the_orms_answer(step):
    started = Step.objects.get(pk=step.pk).started_at
    assert _orm_flag(step, {"started_at": started}) is True
    assert _fast_flag(step, {"started_at": started}) is True


def test_a_locking_read_holds_the_row_against_another_locker(step):
    """Held, not a finding: ``for_update`` with a LEFT JOIN and LIMIT 2 really locks the run's row (PostgreSQL)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import DatabaseError, connection, transaction

    if connection.vendor != "postgresql":
        pytest.skip("SQLite serializes its writers: no row locks")

    def other_locker() -> str:
        try:
            with transaction.atomic():
                Run.objects.select_for_update(nowait=True).get(pk=step.run_id)
            return "got it"
        except DatabaseError:
            return "locked"
        finally:
            connection.close()

    with transaction.atomic():
        selects.select_one(Run, {"pk": step.run_id}, related=("retry_of", "agent"), for_update=True)
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(other_locker).result() == "locked"
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(other_locker).result() == "got it"


def test_a_flag_over_a_self_referencing_key_asks_what_the_orm_asks(step, people):
    """``flags={name: (Run, "retry_of", {})}``: "a run retries this one", as for any other model's key to
    ``model`` (a row sharing a field's value is asked with ``selects.Sharing``)."""
    run = Run.objects.get(pk=step.run_id)
    retry = start_run(agent=run.agent, user=people["requester"], input="again")
    Run.objects.filter(pk=retry.pk).update(retry_of=run)
    orm = Run.objects.annotate(flag=Exists(Run.objects.filter(retry_of=OuterRef("pk")))).get(pk=run.pk).flag
    assert orm is True
    assert selects.select_one(Run, {"pk": run.pk}, flags={"flag": (Run, "retry_of", {})}).flag is True
    assert selects.select_one(Run, {"pk": retry.pk}, flags={"flag": (Run, "retry_of", {})}).flag is False
