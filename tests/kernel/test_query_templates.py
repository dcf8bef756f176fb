"""runs.base.query_templates: a queryset compiled once per key gives, with other values, what the queryset gives."""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from runs.base.query_templates import QueryTemplate

pytestmark = pytest.mark.django_db(transaction=True)


def _users(*, key, name: str, pk: int):
    """Active users called ``name`` or with id ``pk``; with key ``"staff"`` staff only."""
    users = get_user_model().objects.filter(Q(username=name) | Q(pk=pk), is_active=True)
    if key == "staff":
        users = users.filter(is_staff=True)
    return users.order_by("username").values_list("username", "is_staff")


@pytest.fixture
def users():
    User = get_user_model()
    return {name: User.objects.create_user(name, is_staff=name.startswith("staff"), is_active=name != "gone")
            for name in ("ann", "bob", "staff-cy", "gone")}


def test_each_key_is_compiled_once_and_gives_what_the_queryset_gives_for_any_values(users):
    built = []

    def build(**values):
        built.append(values["key"])
        return _users(**values)

    template = QueryTemplate(build, name=str, pk=int)
    asked = [("all", "ann", users["bob"].pk), ("all", "gone", users["gone"].pk), ("staff", "ann", users["staff-cy"].pk),
             ("all", "nobody", -1), ("staff", "staff-cy", users["ann"].pk), ("all", "bob", users["ann"].pk)]
    for key, name, pk in asked:
        assert template.rows(key, name=name, pk=pk) == list(_users(key=key, name=name, pk=pk))
    assert built == ["all", "all", "staff", "staff"]  # once with markers, once with the first values


def test_a_call_is_one_statement_and_builds_no_queryset(users, monkeypatch):
    template = QueryTemplate(_users, name=str, pk=int)
    template.rows("all", name="ann", pk=0)
    monkeypatch.setattr(get_user_model().objects, "filter", None)  # a queryset built now would fail
    with CaptureQueriesContext(connection) as queries:
        assert template.rows("all", name="bob", pk=users["ann"].pk) == [("ann", False), ("bob", False)]
    assert len(queries) == 1


@pytest.mark.parametrize("values", [{"name": None, "pk": 1}, {"name": "ann", "pk": "1"}, {"name": "ann", "pk": True},
                                    {"name": "ann"}, {"name": "ann", "pk": 1, "other": 2}])
def test_a_value_missing_extra_or_not_of_its_kind_is_refused(users, values):
    with pytest.raises(TypeError):
        QueryTemplate(_users, name=str, pk=int).rows("all", **values)


def test_a_value_the_orm_changes_before_binding_it_is_refused_when_compiled(users):
    template = QueryTemplate(lambda *, key, name: get_user_model().objects.filter(username__icontains=name)
                             .values_list("username"), name=str)
    with pytest.raises(TypeError):
        template.rows("all", name="an")


def test_a_value_that_changes_the_sql_is_refused_when_compiled(users):
    # An integer past a column's range: the ORM compiles its comparison to nothing.
    template = QueryTemplate(_users, name=str, pk=int)
    with pytest.raises(TypeError):
        template.rows("all", name="ann", pk=2**64)


def test_a_kind_other_than_str_or_int_is_refused():
    with pytest.raises(TypeError):
        QueryTemplate(_users, name=str, pk=float).rows("all", name="ann", pk=1.0)
