"""A queryset's SQL compiled once per shape, then run with other values: ``QueryTemplate``.

For reads too rich for ``runs.base.selects`` (joins through many-to-many
relations, ``OR`` of subqueries) that run often enough for the ORM's
per-call work to cost more CPU than the statement: building and
compiling the queryset of an inbox item's e-mail recipients took about
3 ms of CPU each time, the statement a tenth of that.

The queryset is built by the caller's own function, so the rule it
states stays written once, in the ORM. It is built and compiled once per
key with a *marker* in place of each value that changes between calls (a
string or integer no real value uses), and the compiled statement's
parameters are searched for the markers: later calls put their values in
those places. The same is what a prepared statement does with ``$1``;
the idea here only moves it up to the queryset.

The SQL text must not depend on the values themselves, only on the
key: values of the marker's own type only (``str`` or ``int``, checked:
``TypeError``), never None, and each value must reach the parameters
exactly as given (a string the ORM transforms, e.g. ``__icontains``, which
wraps it in ``%``, is refused when the template is built: ``TypeError``, as
a query unfit for a template is the caller's bug;
an integer must not be computed with, and is compared with columns of
at least 32 bits: an integer marker is a negative number near -2**31,
which no key holds). A value the query of a key does not use is simply
not bound.
Rows come back as the database driver gives them, with no field
converter applied: for columns that need none (text, integers, booleans).
"""

import itertools
import threading
from typing import Callable

from django.db import connections
from django.db.models import QuerySet

_markers = itertools.count(1)


def _marker(kind: type):
    """A value of ``kind`` (``str`` or ``int``) that no real value holds."""
    number = next(_markers)
    if kind is str:
        return f"\x00tollgate-marker-{number}\x00"
    if kind is int:  # within a 32-bit integer column's range, else the ORM drops the comparison (never true)
        return -(2**31) + number
    raise TypeError(f"a template's values are str or int, not {kind.__name__}")


class QueryTemplate:
    """``build(**values)`` (a function returning a ``QuerySet``) compiled once per key, run with new values.

    ``kinds``: ``{name: str | int}``, the values that change between calls
    (each passed to ``build`` by that name). ``rows(key, **values)`` returns
    the statement's rows (a list of tuples, as the driver gives them);
    ``key`` (hashable) names what else ``build`` depends on, passed to it as
    ``key=``: each key is compiled once. Thread-safe.
    """

    def __init__(self, build: Callable[..., QuerySet], **kinds: type):
        self._build = build
        self._kinds = kinds
        self._compiled: dict = {}  # key -> (database alias, sql, params, {index: name})
        self._lock = threading.Lock()

    def rows(self, key, **values) -> list[tuple]:
        """The rows of the statement of ``key`` with ``values`` in the markers' places.

        Raises ``TypeError`` for a value missing, extra, or not of its kind (None included).
        """
        if values.keys() != self._kinds.keys():
            raise TypeError(f"values for {sorted(self._kinds)} expected, got {sorted(values)}")
        for name, value in values.items():
            if type(value) is not self._kinds[name]:
                raise TypeError(f"{name} must be a {self._kinds[name].__name__}, not {type(value).__name__}")
        alias, sql, params, places = self._compile(key, values)
        params = list(params)
        for index, name in places.items():
            params[index] = values[name]
        with connections[alias].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def _compile(self, key, values: dict) -> tuple:
        """``(alias, sql, params, {parameter index: value name})`` of ``key``, built on first use: once with
        markers, once with ``values``, the two SQL texts compared (``TypeError`` if they differ: the SQL
        depends on a value, e.g. an integer out of a column's range, which the ORM compiles to no comparison)."""
        compiled = self._compiled.get(key)
        if compiled is not None:
            return compiled
        with self._lock:
            if key not in self._compiled:
                markers = {name: _marker(kind) for name, kind in self._kinds.items()}
                queryset = self._build(key=key, **markers)
                sql, params = queryset.query.get_compiler(using=queryset.db).as_sql()
                places = {index: name for index, param in enumerate(params)
                          for name, marker in markers.items() if type(param) is type(marker) and param == marker}
                for index, param in enumerate(params):
                    if index not in places and isinstance(param, str) and "tollgate-marker-" in param:
                        raise TypeError(f"the query changes a value before it is a parameter ({param!r})")
                real = self._build(key=key, **values)
                real_sql, real_params = real.query.get_compiler(using=real.db).as_sql()
                if real_sql != sql or len(real_params) != len(params):
                    raise TypeError(f"the SQL of key {key!r} depends on the values given, not on the key alone")
                self._compiled[key] = (queryset.db, sql, tuple(params), places)
            return self._compiled[key]
