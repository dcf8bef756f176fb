"""Row reads of the engine's hot path as one SQL statement each, built once per shape (``select``, ``select_one``,
``values_one``, ``values``, ``first_value``, ``exists``, ``count``).

The read side of ``runs.base.rows``: what ``Model.objects.filter(...)``
with ``select_related`` (and ``select_for_update``) gives, for filters
that compare a column of the model with values (``=``, ``IN``, ``<``,
``<=``, ``>``, ``>=``, and their negations as ``exclude``), without the
ORM's per-call work. Building and compiling a
queryset costs more CPU than the statement itself for the engine's reads:
the run with its agent, session and requester took 1.4 ms against 0.3 ms
this way (PostgreSQL, 1,000 reads on this 2-core machine).

Same result as the ORM where it matters here: every concrete field of each
model loaded, each value converted as the ORM converts it (the backend's
and the field's ``get_db_converters``, e.g. SQLite's datetimes and
booleans, ``JSONField``'s decoding), instances built by ``Model.from_db``
(the documented hook the ORM itself calls, so ``post_init`` receivers and
django-fsm's initial state see what they always see), and the related rows
cached on the instance as ``select_related`` caches them. No ``Manager``
is involved: a model whose default manager filters rows would not be
filtered (none of the models read here has one).

Wherever a field's name is taken, ``"pk"`` names the model's primary key,
as in the ORM's lookups (``_field``).
"""

import dataclasses
from dataclasses import dataclass

from django.core.exceptions import FieldDoesNotExist
from django.db import connection
from django.db.models import Model
from django.db.transaction import TransactionManagementError, get_autocommit

_SELECTS: dict = {}  # shape key -> _Shape


def _field(meta, name: str):
    """The field ``name`` of the model of ``meta`` (``Model._meta``), ``"pk"`` its primary key as the ORM reads it;
    raises ``FieldDoesNotExist`` for a name it does not have."""
    return meta.pk if name == "pk" else meta.get_field(name)


@dataclass(frozen=True)
class Sharing:
    """A flag's key (``select(flags=...)``): another row of the queried model itself, not this one, whose
    ``field`` holds the same value (e.g. another item of the same run), where a foreign key's name asks for
    the rows of the other model that point at this one."""

    field: str


class _Part:
    """One model's columns in a statement: the fields, their converters, and where the instance goes."""

    def __init__(self, model, alias: str, setter=None, back=None, only: tuple[str, ...] | None = None, parent: int = 0):
        """``only``: the names of the fields read, in that order (``values_one``); default every concrete field.
        ``parent``: the index of the part whose instance caches this one's (``setter``)."""
        self.model = model
        self.fields = [_field(model._meta, name) for name in only] if only else list(model._meta.concrete_fields)
        self.attnames = [field.attname for field in self.fields]
        quote = connection.ops.quote_name
        self.columns = [f"{alias}.{quote(field.column)}" for field in self.fields]
        self.converters = []  # (index, [converter], expression) of the columns that need converting
        for index, field in enumerate(self.fields):
            expression = field.get_col(alias)
            found = connection.ops.get_db_converters(expression) + expression.get_db_converters(connection)
            if found:
                self.converters.append((index, found, expression))
        self.setter = setter  # the relation whose cache the instance fills, on the parent part's instance
        self.back = back  # a one-to-one's other side, whose cache the parent's instance fills on this one
        self.parent = parent

    def convert(self, values: list) -> list:
        """``values`` (this part's columns of a row, changed in place) as the ORM converts them."""
        for index, found, expression in self.converters:
            value = values[index]
            for converter in found:
                value = converter(value, expression, connection)
            values[index] = value
        return values

    def build(self, values: list):
        return self.model.from_db(connection.alias, self.attnames, self.convert(values))


class _Shape:
    def __init__(self, sql: str, parts: list[_Part], flags: tuple[str, ...], nullable: list[bool]):
        self.sql, self.parts, self.flags, self.nullable = sql, parts, flags, nullable


def _shape(model, where: tuple, related: tuple[str, ...], flags: tuple, order_by: tuple[str, ...],
           for_update: bool, limit: int | None, only: tuple[str, ...] | None = None, written: str | None = None,
           extras: tuple[str, ...] = ()) -> _Shape:
    """The statement of one shape, built once. ``written``: a data-modifying statement whose ``RETURNING``
    rows (``select_written``) are read instead of the table, with its ``extras`` columns after the rest."""
    key = (model, where, related, flags, order_by, for_update, limit, only, written, extras, connection.vendor)
    shape = _SELECTS.get(key)
    if shape is not None:
        return shape
    meta, quote = model._meta, connection.ops.quote_name
    main = _Part(model, "t0", only=only)
    parts, joins, nullable, placed = [main], [], [False], {"": 0}  # placed: a related path -> its part's index
    for number, name in enumerate(related, start=1):
        path, _, own = name.rpartition("__")
        parent = placed.get(path)
        if parent is None:
            raise TypeError(f"related {name!r} comes before {path!r} in {related}")
        owner, at = f"t{parent}", parts[parent].model._meta
        field = _field(at, own)
        alias, target = f"t{number}", field.related_model._meta
        if field.concrete:  # a foreign key of the parent's model
            on, optional = f"{owner}.{quote(field.column)} = {alias}.{quote(field.target_field.column)}", field.null
            back = field.remote_field if field.one_to_one else None
        else:  # a reverse one-to-one: the other row's key points at the parent's (there may be none)
            remote = field.remote_field
            on = f"{alias}.{quote(remote.column)} = {owner}.{quote(remote.target_field.column)}"
            optional, back = True, remote
        optional = optional or nullable[parent]  # below an optional row, every row is optional
        parts.append(_Part(field.related_model, alias, setter=field, back=back, parent=parent))
        placed[name] = number
        nullable.append(optional)
        joins.append(f"{'LEFT OUTER' if optional else 'INNER'} JOIN {quote(target.db_table)} {alias} ON {on}")
    selected = [column for part in parts for column in part.columns]
    for _name, (other, pointer, conditions) in flags:
        other_meta = other._meta
        if isinstance(pointer, Sharing):  # another row of the same model sharing the field's value
            column = quote(_field(meta, pointer.field).column)
            tests = [f"f.{column} = t0.{column}", f"f.{quote(meta.pk.column)} <> t0.{quote(meta.pk.column)}"]
        else:  # a row of the other model whose foreign key points at this one
            key_field = _field(other_meta, pointer)
            tests = [f"f.{quote(key_field.column)} = t0.{quote(key_field.target_field.column)}"]
        tests += [f"f.{quote(_field(other_meta, c).column)} = %s" for c in conditions]
        selected.append(f"EXISTS (SELECT 1 FROM {quote(other_meta.db_table)} f WHERE {' AND '.join(tests)})")
    selected += [f"t0.{quote(name)}" for name in extras]
    tests = _tests_sql(meta, where, "t0.")
    source = quote(meta.db_table) if written is None else "written"
    sql = (f"SELECT {', '.join(selected)} FROM {source} t0 {' '.join(joins)}"
           + (f" WHERE {' AND '.join(tests)}" if tests else ""))
    if written is not None:
        sql = f"WITH written AS ({written}) {sql}"
    if order_by:
        sql += " ORDER BY " + ", ".join(_order(meta, name, "t0.") for name in order_by)
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    if for_update and connection.features.has_select_for_update:
        sql += " FOR UPDATE OF t0" if connection.features.has_select_for_update_of else " FOR UPDATE"
    shape = _SELECTS[key] = _Shape(sql, parts, tuple(name for name, _ in flags), nullable)
    return shape


def select(model, where: dict, *, related: tuple[str, ...] = (), flags: dict | None = None,
           order_by: str | tuple[str, ...] = (), for_update: bool = False, attach: dict | None = None,
           limit: int | None = None, exclude: dict | None = None) -> list:
    """The rows of ``model`` whose fields equal ``where`` (``{field name: value}``, ``pk`` allowed; a name may
    end in a lookup: ``__in``, ``__lt``, ``__lte``, ``__gt``, ``__gte``), less those matching all of ``exclude``
    (the same form; fields that hold no NULL), as instances, in one statement:
    ``Model.objects.filter(**where).exclude(**exclude).select_related(*related)`` read without building a queryset.

    ``related``: foreign keys of ``model`` and reverse one-to-one relations whose rows are read along and
    cached on each instance as ``select_related`` caches them (``"run__agent"``: a relation of the row
    ``"run"`` read, named after it in ``related``) (``None`` for a nullable key left
    empty; a reverse one-to-one without a row raises ``RelatedObjectDoesNotExist`` when read, no query). ``flags``: ``{attribute: (other model, its foreign
    key to model, {field name: value})}``, each set on every instance to whether such a row of the other
    model exists (an ``EXISTS`` in the same statement); with ``(model, Sharing(field), {...})``, whether
    another row of ``model`` (not this one) has the same value of ``field`` and the values given. ``order_by``: a field name, ascending
    (``"-name"``: descending), or a tuple of them; not a relation's (``TypeError``).
    ``limit``: at most that many rows.
    ``for_update``: lock the rows of ``model`` (not the related ones: ``FOR UPDATE OF``), inside a
    transaction only; nothing on SQLite, whose writers are serialized. ``attach``: ``{foreign key name:
    instance}`` cached on every row as it is (e.g. the run whose calls these are).

    Raises ``TypeError`` for a None in ``where`` or a flag's values, ``TransactionManagementError`` for ``for_update`` outside a
    transaction (as the ORM does), and what the database raises.
    """
    if any(None in conditions.values() for _, _, conditions in (flags or {}).values()):
        raise TypeError("select() compares with '=': a None would match no row (the ORM's IS NULL)")
    _lockable("select", for_update)
    meta = model._meta
    where_fields, params = _where(model, where, exclude)
    order_by = (order_by,) if isinstance(order_by, str) else tuple(order_by)
    shape = _shape(model, where_fields, tuple(related), _flag_items(flags), order_by, for_update, limit)
    flag_params = _flag_params(flags)
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, flag_params + params)
        found = cursor.fetchall()
    attach_fields = [(_field(meta, name), instance) for name, instance in (attach or {}).items()]
    instances = []
    for row in found:
        instance, _extras = _built(shape, row)
        for field, value in attach_fields:
            field.set_cached_value(instance, value)
        instances.append(instance)
    return instances


def _built(shape: _Shape, row) -> tuple:
    """``(instance, the extra columns' values)`` of one row a statement of ``shape`` read: the main model's
    instance, its related rows cached on it, its flags set."""
    row, start = list(row), 0
    built = []
    for part, nullable in zip(shape.parts, shape.nullable):
        values = row[start:start + len(part.fields)]
        start += len(part.fields)
        empty = nullable and values[part.attnames.index(part.model._meta.pk.attname)] is None
        built.append(None if empty else part.build(values))
    for part, related_instance in zip(shape.parts[1:], built[1:]):
        owner = built[part.parent]
        if owner is None:  # its parent's row is missing: so is this one
            continue
        part.setter.set_cached_value(owner, related_instance)  # None: no row (a reverse one raises)
        if part.back is not None and related_instance is not None:
            part.back.set_cached_value(related_instance, owner)
    instance = built[0]
    for name, value in zip(shape.flags, row[start:]):
        setattr(instance, name, bool(value))
    return instance, tuple(row[start + len(shape.flags):])


def _flag_items(flags: dict | None) -> tuple:
    return tuple((name, (other, key, tuple(conditions))) for name, (other, key, conditions) in (flags or {}).items())


def _flag_params(flags: dict | None) -> list:
    return [_prepared(other._meta, name, value) for other, _key, conditions in (flags or {}).values()
            for name, value in conditions.items()]


def _prepared(meta, name: str, value):
    """``value`` of field ``name`` as the database compares it (a model instance: its key), as a filter sends it."""
    if isinstance(value, Model):
        return value.pk
    return _field(meta, name).get_db_prep_value(value, connection)


def _order(meta, name: str, prefix: str) -> str:
    """``ORDER BY``'s term for field ``name`` of ``meta``'s model (``"-name"``: descending), its column named with
    ``prefix``. Raises ``TypeError`` for a relation: the ORM would follow the related model's ``Meta.ordering``."""
    field = _field(meta, name.lstrip("-"))
    if field.is_relation:
        raise TypeError(f"selects order by a field of the model's own, not by the relation {field.name!r}")
    return f"{prefix}{connection.ops.quote_name(field.column)}" + (" DESC" if name.startswith("-") else "")


# Lookups ``where`` and ``exclude`` take after a field's name (``"pk__lt"``), as the ORM's; none: ``exact``.
_OPERATORS = {"exact": "=", "lt": "<", "lte": "<=", "gt": ">", "gte": ">=", "in": "IN"}


def _where(model, where: dict, exclude: dict | None = None) -> tuple[tuple, list]:
    """``where`` and ``exclude`` (as ``select`` takes them) as a shape's tests and the values to send with them.

    A name is a field's (or ``"pk"``), then a lookup of ``_OPERATORS`` or none (``exact``); or a foreign key's,
    then a field of the row it points at (``"run__session"``: equality only, in ``where`` only), read as
    ``key IN (SELECT ... WHERE field = %s)``. An ``in`` takes a list, tuple or set (its length is part of the
    shape). Raises ``TypeError`` for a None (``=`` would match no row where the ORM reads ``IS NULL``), an
    unknown lookup, an ``exclude`` on a nullable field (the ORM keeps that field's NULL rows: not done here)
    or through a foreign key.
    """
    meta, tests, params = model._meta, [], []
    for negated, conditions in ((False, where), (True, exclude or {})):
        for name, value in conditions.items():
            field_name, _, lookup = name.partition("__")
            field, through = _field(meta, field_name), None
            if lookup and lookup not in _OPERATORS:
                if not (field.many_to_one and "__" not in lookup) or negated:
                    raise TypeError(f"selects know the lookups {sorted(_OPERATORS)} and a foreign key's field "
                                    f"(in where), not {name!r}")
                try:
                    through, lookup = _field(field.related_model._meta, lookup).name, "exact"
                except FieldDoesNotExist:
                    raise TypeError(f"{lookup!r} is neither a lookup selects know nor a field of "
                                    f"{field.related_model.__name__}") from None
            lookup = lookup or "exact"
            if negated and field.null:
                raise TypeError(f"selects exclude only on fields that hold no NULL, not {field.name!r}")
            values = list(value) if lookup == "in" else [value]
            if None in values:
                raise TypeError("selects compare with '=': a None would match no row (the ORM's IS NULL)")
            tests.append((field.name, lookup, len(values) if lookup == "in" else None, negated, through))
            prepared_by = (field.related_model._meta, through) if through else (meta, field.name)
            params += [_prepared(*prepared_by, one) for one in values]
    return tuple(tests), params


def _tests_sql(meta, tests: tuple, prefix: str) -> list[str]:
    """The SQL of each of ``tests`` (``_where``'s) on the columns of ``meta``'s table, named with ``prefix``."""
    quote, found, excluded = connection.ops.quote_name, [], []
    for name, lookup, count, negated, through in tests:
        field = _field(meta, name)
        column = f"{prefix}{quote(field.column)}"
        if through is not None:
            target = field.related_model._meta
            test = (f"{column} IN (SELECT {quote(field.target_field.column)} FROM {quote(target.db_table)} "
                    f"WHERE {quote(_field(target, through).column)} = %s)")
        elif lookup == "in":
            test = f"{column} IN ({', '.join(['%s'] * count)})" if count else "1 = 0"
        else:
            test = f"{column} {_OPERATORS[lookup]} %s"
        (excluded if negated else found).append(test)
    return found + ([f"NOT ({' AND '.join(excluded)})"] if excluded else [])


def _lockable(caller: str, for_update: bool) -> None:
    """Raises ``TransactionManagementError`` for a lock asked for outside a transaction, as the ORM does."""
    if for_update and get_autocommit():
        raise TransactionManagementError(f"{caller}(for_update=True) cannot be used outside of a transaction.")


def _the_one(model, where: dict, found: list):
    """The only item of ``found`` (what ``where`` matched, two read at most); raises ``model.DoesNotExist`` for
    none and ``model.MultipleObjectsReturned`` for more, as ``QuerySet.get`` does."""
    if not found:
        raise model.DoesNotExist(f"{model.__name__} matching {where} does not exist")
    if len(found) > 1:
        raise model.MultipleObjectsReturned(f"{len(found)} {model.__name__} rows match {where}")
    return found[0]


def values_one(model, where: dict, fields: tuple[str, ...], *, for_update: bool = False) -> tuple:
    """The values of ``fields`` (names, ``"pk"`` allowed) of the one row of ``model`` whose fields equal ``where``, converted as
    the ORM converts them, in one statement: ``Model.objects.filter(**where).values_list(*fields).get()``
    (with ``for_update``: ``select_for_update()`` first) read without building a queryset, no instance built.

    Raises ``model.DoesNotExist`` when no row matches, ``model.MultipleObjectsReturned`` when more do (two
    rows read at most), ``TypeError`` for a None in ``where``, ``TransactionManagementError`` for
    ``for_update`` outside a transaction, and what the database raises.
    """
    _lockable("values_one", for_update)
    where_fields, params = _where(model, where)
    shape = _shape(model, where_fields, (), (), (), for_update, 2, tuple(fields))
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, params)
        found = cursor.fetchall()
    return tuple(shape.parts[0].convert(list(_the_one(model, where, found))))


def values(model, where: dict, fields: tuple[str, ...], *, order_by: str | tuple[str, ...] = ()) -> list[tuple]:
    """The values of ``fields`` (names, ``"pk"`` allowed) of every row of ``model`` matching ``where`` (as
    ``select`` takes it), converted as the ORM converts them, in ``order_by``'s order (as ``select``'s), in one
    statement: ``filter(**where).order_by(*order_by).values_list(*fields)`` without building a queryset or
    an instance. Raises ``TypeError`` as ``select`` does, and what the database raises."""
    where_fields, params = _where(model, where)
    order_by = (order_by,) if isinstance(order_by, str) else tuple(order_by)
    shape = _shape(model, where_fields, (), (), order_by, False, None, tuple(fields))
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, params)
        found = cursor.fetchall()
    part = shape.parts[0]
    return [tuple(part.convert(list(row))) for row in found] if part.converters else found


_TALLIES: dict = {}  # (model, where's tests, what, tail, vendor) -> sql


def _tally(model, where: dict, what: str, tail: str = "", exclude: dict | None = None):
    """The first column of the first row of ``SELECT <what> FROM model WHERE <where, exclude> <tail>`` (None when
    there is no row; ``where`` and ``exclude`` as ``select`` takes them), the SQL built once per shape."""
    meta = model._meta
    where_fields, params = _where(model, where, exclude)
    key = (model, where_fields, what, tail, connection.vendor)
    sql = _TALLIES.get(key)
    if sql is None:
        tests = " AND ".join(_tests_sql(meta, where_fields, ""))
        sql = _TALLIES[key] = (f"SELECT {what} FROM {connection.ops.quote_name(meta.db_table)}"
                               + (f" WHERE {tests}" if tests else "") + tail)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else row[0]


def exists(model, where: dict, *, exclude: dict | None = None) -> bool:
    """Whether a row of ``model`` matches ``where`` and not ``exclude`` (as ``select`` takes them), in one
    statement built once per shape: ``Model.objects.filter(**where).exclude(**exclude).exists()`` without
    building a queryset. Raises ``TypeError`` as ``select`` does, and what the database raises."""
    return _tally(model, where, "1", " LIMIT 1", exclude) is not None


def first_value(model, where: dict, field: str, *, order_by: str):
    """``field``'s value (a name, ``"pk"`` allowed; no conversion: an integer or text column) of the first row of
    ``model`` matching ``where`` (as ``select`` takes it) in ``order_by``'s order (a field name, ascending;
    ``"-name"``: descending), None when none does, in one statement built once per shape:
    ``filter(**where).order_by(order_by).values_list(field, flat=True).first()`` without building a queryset."""
    column = connection.ops.quote_name(_field(model._meta, field).column)
    return _tally(model, where, column, f" ORDER BY {_order(model._meta, order_by, '')} LIMIT 1")


def count(model, where: dict) -> int:
    """How many rows of ``model`` have fields equal to ``where`` (as ``exists`` takes it), in one statement built
    once per shape: ``Model.objects.filter(**where).count()`` without building a queryset."""
    return _tally(model, where, "COUNT(*)")


def select_one(model, where: dict, **options):
    """The one row ``select(model, where, **options)`` finds (reading two at most, as ``QuerySet.get`` bounds its
    read); raises ``model.DoesNotExist`` when there is none and ``model.MultipleObjectsReturned`` when there are
    more."""
    return _the_one(model, where, select(model, where, limit=2, **options))


@dataclass(frozen=True)
class Reading:
    """How a row of ``model`` is read beside its own columns: the ``related`` rows read along and the ``flags``
    (as ``select`` takes them). Names one read that is made in more than one way (``one``, ``select_written``)."""

    model: type
    related: tuple[str, ...] = ()
    flags: dict = dataclasses.field(default_factory=dict)

    def one(self, pk):
        """``select_one`` of the row whose primary key is ``pk``; raises ``model.DoesNotExist`` when there is none."""
        return select_one(self.model, {"pk": pk}, related=self.related, flags=self.flags)


def select_written(reading: Reading, write: str, params: list, extras: tuple[str, ...] = ()) -> tuple | None:
    """``(instance, the values of extras)`` of the one row of ``reading.model`` that ``write`` wrote; None when it
    wrote none.

    ``write``: a data-modifying statement (an ``UPDATE``) of the model's table whose ``RETURNING`` gives every
    column of the table (``<table>.*``), then one column per name of ``extras`` (``... AS <name>``); ``params``:
    its parameters. The row is built as ``select`` builds it with ``reading``'s related rows and flags, all in
    that one statement (PostgreSQL's data-modifying ``WITH``): the row's own columns as written, the related
    rows and the flags as of the statement's snapshot. That snapshot does not see what a transaction committed
    while the write waited for the row's lock; a caller that must know compares a column as the snapshot had it
    with the row as written (``runs.lease.acquire``). PostgreSQL only. Raises ``MultipleObjectsReturned``
    when it wrote more than one row, ``TypeError`` for a None in a flag's values, and what the database raises.
    """
    flags = reading.flags
    if any(None in conditions.values() for _, _, conditions in flags.values()):
        raise TypeError("select_written() compares flags with '=': a None would match no row (the ORM's IS NULL)")
    shape = _shape(reading.model, (), tuple(reading.related), _flag_items(flags), (), False, None,
                   written=write, extras=tuple(extras))
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, list(params) + _flag_params(flags))
        found = cursor.fetchall()
    if len(found) > 1:
        raise reading.model.MultipleObjectsReturned(f"the write returned {len(found)} rows")
    return _built(shape, found[0]) if found else None
