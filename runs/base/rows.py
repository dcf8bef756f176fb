"""Row writes and reads of the engine's hot path as one SQL statement each, built once per shape.

``insert``/``insert_many`` and ``update`` do what ``Model.save`` does for
the models of the hot path (runs, events, steps, tool calls, messages);
``update_columns`` is a fenced ``UPDATE ... RETURNING`` of chosen columns
and ``counter`` reads one integer column. They skip the ORM's per-call
work (building and compiling a query for every statement) and give the
engine what it needs from the statement (the row count, the ids). The SQL
text of each shape is built once and kept.

Same behaviour as ``save`` where it matters here: ``auto_now`` and
``auto_now_add`` stamps (``Field.pre_save``), values converted as the
fields convert them (``get_db_prep_save``, skipped only for values it
would pass on unchanged: ``_AS_IS``), the instance marked stored. No
``pre_save`` or ``post_save`` signal is sent: callers whose model has
receivers send ``post_save`` themselves (``runs.services.append_events``).
``expected`` values are compared with ``=``, so they must not be None.
"""

from django.db import connection
from django.db.models import Model

_INSERTS: dict = {}  # (model, rows) -> (sql, fields, kinds)
_MAX_CACHED_ROWS = 16  # statements of more rows are built each time (rare: a transaction's events of one run)
_COUNTERS: dict = {}  # (model, field name) -> sql
_UPDATES: dict = {}  # (model, value names, increment names, expected names, returning) -> (sql, fields, kinds)


# Per field type, the values its get_db_prep_save passes on unchanged (besides None): any str for text
# (a str enum too: Django hands it to the driver as it is), and exactly int or bool for the others (Django
# turns an int enum or a numeric str into an int, a bool into 1, and refuses text). Such values skip the
# call, which is most of an INSERT's CPU; any other value is converted by the field as save() converts it.
_AS_IS = {"CharField": str, "TextField": str, "BooleanField": bool, "AutoField": int, "BigAutoField": int,
          "BigIntegerField": int, "IntegerField": int, "PositiveIntegerField": int, "PositiveSmallIntegerField": int,
          "SmallIntegerField": int}


def _params(instance: Model, fields: list, kinds: list, add: bool) -> list:
    """The database values of ``fields`` of ``instance`` (``kinds``: ``_kinds(fields)``)."""
    params = []
    for field, kind in zip(fields, kinds):
        if kind is not None:
            value = getattr(instance, field.attname)
            if value is None or value.__class__ is kind or (kind is str and isinstance(value, str)):
                params.append(value)
                continue
        params.append(field.get_db_prep_save(field.pre_save(instance, add=add), connection))
    return params


def _kinds(fields: list) -> list[type | None]:
    """Per field, the type of the values it stores as they are (``_AS_IS``; a foreign key's: its target's),
    or None when every value goes through the field (``pre_save`` and ``get_db_prep_save``)."""
    kinds = []
    for field in fields:
        stored = field.target_field if field.is_relation else field
        plain = not (getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False))
        kinds.append(_AS_IS.get(stored.get_internal_type()) if plain else None)
    return kinds


def insert(instance: Model) -> Model:
    """Insert ``instance`` (not stored, auto primary key unset) in one statement; returns it, its key set (``RETURNING``).

    Raises what the database raises (``IntegrityError``, ``DataError``).
    """
    return insert_many([instance])[0]


def insert_many(instances: list[Model]) -> list[Model]:
    """Insert ``instances`` (at least one, all of one model, none stored yet) in one statement, in order;
    returns them, stored, their primary keys set (``INSERT ... VALUES (...), (...) RETURNING``). Where the
    database cannot return columns from an insert, one statement per instance. Raises what the database
    raises."""
    model = type(instances[0])
    returning = connection.features.can_return_columns_from_insert
    count = len(instances) if returning else 1
    shape = _INSERTS.get((model, count))
    if shape is None:
        meta, quote = model._meta, connection.ops.quote_name
        fields = [f for f in meta.concrete_fields if not (f.primary_key and f.auto_created)]
        columns = ", ".join(quote(f.column) for f in fields)
        row = f"({', '.join(['%s'] * len(fields))})"
        sql = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES {', '.join([row] * count)}"
        if returning:
            sql += f" RETURNING {quote(meta.pk.column)}"
        shape = (sql, fields, _kinds(fields))
        if count <= _MAX_CACHED_ROWS:
            _INSERTS[(model, count)] = shape
    sql, fields, kinds = shape
    with connection.cursor() as cursor:
        if returning:
            params = [value for instance in instances for value in _params(instance, fields, kinds, add=True)]
            cursor.execute(sql, params)
            pks = [row[0] for row in cursor.fetchall()]  # in VALUES order, as Django's bulk_create relies on too
        else:
            pks = []
            for instance in instances:
                cursor.execute(sql, _params(instance, fields, kinds, add=True))
                pks.append(cursor.lastrowid)
    for instance, pk in zip(instances, pks):
        _stored(instance, pk)
    return instances


def update(instance: Model, fields: list[str], *, expected: dict | None = None) -> int:
    """Write the ``fields`` (names) of a stored ``instance`` in one UPDATE; returns the rows written (0 or 1).

    ``expected``: ``{field name: value}`` the row must still hold (e.g.
    the status it was loaded with: django-fsm's optimistic lock), or it is
    not written (0). ``auto_now`` fields among ``fields`` are stamped now.
    """
    sql, params = _row_update(instance, fields, expected or {})
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _row_update(instance: Model, fields, expected: dict) -> tuple[str, list]:
    """The SQL and parameters of ``update``'s statement."""
    model = type(instance)
    sql, parameters, kinds = _update_shape(model, tuple(fields), (), tuple(expected), None)
    params = _params(instance, parameters[:len(fields)], kinds, add=False)
    params.append(instance.pk)
    params.extend(model._meta.get_field(name).get_db_prep_value(value, connection) for name, value in expected.items())
    return sql, params


def counter(model, field: str, pk) -> int:
    """The integer column ``field`` of ``model``'s row ``pk``, read in one statement built once.

    For integer columns only (the value is returned as the database gives
    it, with no conversion). Raises ``model.DoesNotExist`` if there is no
    such row.
    """
    sql = _COUNTERS.get((model, field))
    if sql is None:
        meta, quote = model._meta, connection.ops.quote_name
        sql = _COUNTERS[(model, field)] = (f"SELECT {quote(meta.get_field(field).column)} FROM "
                                           f"{quote(meta.db_table)} WHERE {quote(meta.pk.column)} = %s")
    with connection.cursor() as cursor:
        cursor.execute(sql, [pk])
        row = cursor.fetchone()
    if row is None:
        raise model.DoesNotExist(f"{model.__name__} {pk} does not exist")
    return row[0]


def _update_shape(model, values: tuple, increments: tuple, expected: tuple, returning: str | None) -> tuple:
    """``(sql, fields, kinds)`` of the fenced ``UPDATE`` of one ``model`` row that ``update`` and ``update_columns``
    share, built once per shape: ``values`` set, ``increments`` added, ``WHERE pk = %s AND expected = %s``, and
    ``RETURNING`` the ``returning`` column when given; ``fields``: each parameter's field, in that order."""
    key = (model, values, increments, expected, returning)
    shape = _UPDATES.get(key)
    if shape is None:
        meta, quote = model._meta, connection.ops.quote_name
        set_fields = [meta.get_field(name) for name in values]
        added = [meta.get_field(name) for name in increments]
        checked = [meta.get_field(name) for name in expected]
        assignments = [f"{quote(f.column)} = %s" for f in set_fields]
        assignments += [f"{quote(f.column)} = {quote(f.column)} + %s" for f in added]
        sql = (f"UPDATE {quote(meta.db_table)} SET {', '.join(assignments)} WHERE {quote(meta.pk.column)} = %s"
               + "".join(f" AND {quote(f.column)} = %s" for f in checked)
               + (f" RETURNING {quote(meta.get_field(returning).column)}" if returning else ""))
        fields = set_fields + added + [meta.pk] + checked
        shape = _UPDATES[key] = (sql, fields, _kinds(fields))
    return shape


def update_columns(model, pk, *, values: dict, increments: dict, expected: dict, returning: str):
    """``UPDATE`` row ``pk`` of ``model``: ``values`` set, ``increments`` added (``{name: amount}``), only
    if the row holds ``expected`` (``{name: value}``); returns the new value of column ``returning``, or
    None if no row was written. One statement (``UPDATE ... RETURNING``), for databases that can return
    columns from a write (``connection.features.can_return_columns_from_insert``)."""
    sql, fields, kinds = _update_shape(model, tuple(values), tuple(increments), tuple(expected), returning)
    with connection.cursor() as cursor:
        cursor.execute(sql, _column_params(fields, kinds, [*values.values(), *increments.values(), pk,
                                                           *expected.values()]))
        row = cursor.fetchone()
    return row[0] if row else None


def _column_params(fields: list, kinds: list, values: list) -> list:
    """``values`` (one per field) as the database takes them: as they are where ``_AS_IS`` allows, else converted."""
    params = []
    for field, kind, value in zip(fields, kinds, values):
        as_is = kind is not None and (value is None or value.__class__ is kind
                                      or (kind is str and isinstance(value, str)))
        params.append(value if as_is else field.get_db_prep_save(value, connection))
    return params


_AND_INSERT: dict = {}  # (update statement, rows model, rows, numbered field) -> (sql, fields, kinds)


def update_and_insert_numbered(model, pk, *, values: dict, increments: dict, expected: dict, counted: str,
                               instances: list[Model], position: str, also: list[tuple] = (),
                               extra: list[Model] = ()) -> int | None:
    """``update_columns`` and ``insert_many`` in one statement (PostgreSQL: a data-modifying ``WITH``), the
    inserted rows numbered from the update: row ``pk`` of ``model`` gets ``values`` and ``increments``, and
    its integer column ``counted`` moves on by ``len(instances)``, if it holds ``expected``; then
    ``instances`` (at least one, all of one model, none stored) are inserted, their field ``position`` the
    counter's new value for the last one, one less for the one before, and so on.

    ``also``: ``(instance, field names, expected)`` writes, each of a stored row of another model (at most
    one write per row) whose ``fields`` the same statement writes (``auto_now`` ones stamped), after row
    ``pk`` (whose lock it takes first), only if it holds ``expected`` (``{name: value}``, as ``update``
    takes it).

    ``extra``: rows of one other model (none stored, auto primary key), inserted by the same statement in
    that order, only with the others (e.g. the messages a transaction appends with its events); stored
    (keys set) on return.

    Returns the counter's new value, the instances stored (keys and ``position`` set); or None when a row
    was not written (it does not hold ``expected``, or is gone): then no instance is inserted either, but
    when only rows of ``also`` were not written, the others' updates were made: the caller rolls its
    transaction back. Raises ``TypeError`` when ``increments`` or ``values`` name ``counted`` (the rows move it), and what
    the database raises (``DataError``, ``IntegrityError``); the update is undone with the insert.
    """
    if counted in increments or counted in values:
        raise TypeError(f"{counted} moves by the number of rows inserted, not by the caller")
    increments = {counted: len(instances), **increments}
    numbered = type(instances[0])._meta.get_field(position)
    keys = _update_and_insert(model, pk, values, increments, expected, counted, instances, numbered, also, extra)
    if not keys:
        return None
    extra_keys = sorted(keys.pop(None, ()))  # in VALUES order, as the key sequence handed them out
    for instance, key in zip(extra, extra_keys):
        _stored(instance, key)
    last = max(keys)
    for number, instance in enumerate(instances, start=last - len(instances) + 1):
        setattr(instance, numbered.attname, number)
        _stored(instance, keys[number])
    return last


def update_and_insert_one(model, pk, *, values: dict, expected: dict, instance: Model) -> bool:
    """``update_columns`` of row ``pk`` of ``model`` (``values`` set if it holds ``expected``) and ``insert`` of
    ``instance`` (not stored) only if the row was written, as one statement (PostgreSQL: a data-modifying
    ``WITH``; outside a transaction, a transaction of its own). True when both were written (the instance's key
    set); False when neither was. Raises what the database raises."""
    keys = _update_and_insert(model, pk, values, {}, expected, model._meta.pk.name, [instance], None)
    if keys:
        _stored(instance, next(iter(keys.values())))
    return bool(keys)


def _also(write: tuple) -> tuple[str, list]:
    """The SQL and parameters of one ``also`` write's ``UPDATE`` (``update_and_insert_numbered``): ``update``'s
    statement, run only once ``written`` was (a one-time filter: the first row's lock is taken first),
    returning a row if written."""
    sql, params = _row_update(*write)
    return f"{sql} AND EXISTS (SELECT 1 FROM written) RETURNING 1", params


def _stored(instance: Model, pk) -> None:
    """Mark ``instance`` stored under key ``pk``, as ``save()`` leaves it."""
    instance.pk = pk
    instance._state.adding = False
    instance._state.db = connection.alias


def _values_insert(rows_model, count: int, source: str, numbered=None, counter_sql: str = "") -> tuple:
    """``(sql, fields)``: ``INSERT INTO`` ``rows_model``'s table of ``count`` rows given as parameters (one ``n``,
    their order, then one per field of ``fields``), one per row of ``source`` (a ``FROM`` list), in ``n``'s order.
    ``numbered``: a field set to ``counter_sql - count + n`` instead (not a parameter)."""
    rows_meta, quote = rows_model._meta, connection.ops.quote_name
    fields = [f for f in rows_meta.concrete_fields if not (f.primary_key and f.auto_created) and f is not numbered]
    names = [f"c{i}" for i in range(len(fields))]
    # Typed placeholders: a VALUES list in a FROM clause has no column types of its own. The type without
    # its length or scale (``varchar``, not ``varchar(32)``): a cast would cut text to the length, where
    # storing it into the column refuses it, as save() does.
    row = ", ".join(["%s"] + [f"%s::{f.db_type(connection).split('(')[0]}" for f in fields])
    columns, selected = [quote(f.column) for f in fields], [f"v.{name}" for name in names]
    if numbered is not None:
        columns.append(quote(numbered.column))
        selected.append(f"{counter_sql} - {count} + v.n")
    sql = (f"INSERT INTO {quote(rows_meta.db_table)} ({', '.join(columns)}) SELECT {', '.join(selected)} "
           f"FROM {source} CROSS JOIN (VALUES {', '.join([f'({row})'] * count)}) AS v(n, {', '.join(names)}) "
           f"ORDER BY v.n")
    return sql, fields


def _update_and_insert(model, pk, values, increments, expected, returning, instances, numbered,
                       also: list[tuple] = (), extra: list[Model] = ()) -> dict:
    """Run the ``WITH written AS (UPDATE ...) INSERT ... SELECT ... FROM written`` statement; the inserted
    rows' keys by their ``numbered`` field's value (by None without one: one instance only). ``also``: as
    ``update_and_insert_numbered`` takes it, one more ``WITH`` each, the rows inserted only with all of them.
    ``extra`` (with ``numbered`` only): rows of another model inserted with them, their keys under None (a list)."""
    update_sql, written, kinds = _update_shape(model, tuple(values), tuple(increments), tuple(expected), returning)
    rows_model, count = type(instances[0]), len(instances)
    extra_model, extra_count = (type(extra[0]), len(extra)) if extra else (None, 0)
    if extra and (numbered is None or any(type(row) is not extra_model for row in extra)):
        raise TypeError("extra rows go with numbered rows, and are all of one model")
    also_sqls, also_params = [], []
    for write in also:
        sql, params = _also(write)
        also_sqls.append(sql)
        also_params.extend(params)
    key = (update_sql, *also_sqls, rows_model, count, numbered, extra_model, extra_count)
    shape = _AND_INSERT.get(key)
    if shape is None:
        quote = connection.ops.quote_name
        source = "written" + "".join(f" CROSS JOIN also{n}" for n in range(len(also_sqls)))
        counter_sql = f"written.{quote(model._meta.get_field(returning).column)}"
        insert_sql, fields = _values_insert(rows_model, count, source, numbered, counter_sql)
        returned = quote(rows_model._meta.pk.column)
        if numbered is not None:
            returned += f", {quote(numbered.column)}"
        withs = "".join(f", also{n} AS ({sql})" for n, sql in enumerate(also_sqls))
        extra_fields = []
        if extra:
            # A data-modifying WITH runs whether or not the main query reads it; its keys come back beside
            # the numbered rows' with no number (NULL).
            extra_sql, extra_fields = _values_insert(extra_model, extra_count, source)
            sql = (f"WITH written AS ({update_sql}){withs}, numbered AS ({insert_sql} RETURNING {returned}), "
                   f"extra AS ({extra_sql} RETURNING {quote(extra_model._meta.pk.column)} AS id) "
                   f"SELECT * FROM numbered UNION ALL SELECT id, NULL FROM extra")
        else:
            sql = f"WITH written AS ({update_sql}){withs} {insert_sql} RETURNING {returned}"
        shape = (sql, fields, _kinds(fields), extra_fields, _kinds(extra_fields))
        if count + extra_count <= _MAX_CACHED_ROWS:
            _AND_INSERT[key] = shape
    sql, fields, field_kinds, extra_fields, extra_kinds = shape
    params = _column_params(written, kinds, [*values.values(), *increments.values(), pk, *expected.values()])
    params.extend(also_params)
    for n, instance in enumerate(instances, start=1):
        params.append(n)
        params.extend(_params(instance, fields, field_kinds, add=True))
    for n, instance in enumerate(extra, start=1):
        params.append(n)
        params.extend(_params(instance, extra_fields, extra_kinds, add=True))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    if numbered is None:
        return {None: row[0] for row in found}
    keys = {row[1]: row[0] for row in found if row[1] is not None}
    if extra and keys:
        keys[None] = [row[0] for row in found if row[1] is None]
    return keys
