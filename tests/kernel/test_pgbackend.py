"""Savepoints left to the transaction's end (runs.base.pgbackend.base.releases_deferred), on PostgreSQL."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from runs.base.pgbackend.base import releases_deferred
from tools.models import PolicyLock

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's backend")]


def row(key: str) -> None:
    """A row with a unique key (a policy lock's)."""
    PolicyLock.objects.create(key=key)


def test_savepoints_are_not_released_and_what_each_kept_commits():
    with CaptureQueriesContext(connection) as statements:
        with transaction.atomic(), releases_deferred():
            for key in ("a", "b", "c"):
                with transaction.atomic():  # a savepoint per block, as a group's jobs take
                    row(key)
    sent = [s["sql"] for s in statements.captured_queries]
    assert sum(sql.startswith("SAVEPOINT") for sql in sent) == 3
    assert not any(sql.startswith("RELEASE") for sql in sent)
    assert sorted(PolicyLock.objects.filter(key__in="abc").values_list("key", flat=True)) == ["a", "b", "c"]


def test_a_block_that_fails_still_undoes_only_its_own_work():
    with transaction.atomic(), releases_deferred():
        row("kept")
        with pytest.raises(IntegrityError), transaction.atomic():
            row("undone")
            row("kept")  # the key is unique: the block fails and rolls back to its savepoint
        with transaction.atomic():
            row("after")
    assert sorted(PolicyLock.objects.values_list("key", flat=True)) == ["after", "kept"]


def test_outside_the_block_savepoints_are_released_again():
    with transaction.atomic():
        with releases_deferred():
            pass
        with CaptureQueriesContext(connection) as statements, transaction.atomic():
            row("x")
    assert any(s["sql"].startswith("RELEASE") for s in statements.captured_queries)
