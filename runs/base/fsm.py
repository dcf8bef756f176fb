"""The base of every state-machine model: optimistic locking, thread-safe reload, event hooks.

django-fsm-2's ``FSMModelMixin.refresh_from_db`` lifts the protection of
protected state fields by flipping a flag on the *field*, which is shared by
every instance in the process; a worker with several threads reloading at
once then fails with "Direct status modification is not allowed". The
reload here writes the fresh values straight into the instance instead and
leaves the field's protection alone.

Each machine also says how its transitions are written to the run's event
log (``event_type``, ``event_run``, ``event_payload``) and what else follows
one (``after_transition``); ``runs.transitions`` reads these, so the kernel
records every machine the same way without importing the models of the
layers above it.
"""

from django.db import DEFAULT_DB_ALIAS, DatabaseError, models
from django_fsm import ConcurrentTransition, ConcurrentTransitionMixin

from runs.base import rows, selects


class FSMModel(ConcurrentTransitionMixin, models.Model):
    """Abstract base: ``ConcurrentTransitionMixin``, a thread-safe ``refresh_from_db`` and the event hooks."""

    #: ``RunEvent.type`` of this machine's transitions.
    event_type = "transition"

    class Meta:
        abstract = True

    def event_run(self):
        """The ``runs.Run`` whose event log records this machine's transitions."""
        raise NotImplementedError(f"{type(self).__name__} does not name the run that logs its transitions")

    def event_payload(self, arguments: dict) -> dict:
        """The ``RunEvent.payload`` of a transition, given the keyword ``arguments`` it was called with."""
        return {}

    def after_transition(self, from_status: str, before: dict) -> None:
        """Called by ``runs.transitions.apply`` inside its transaction once a transition of this machine from
        ``from_status`` is written; ``before``: the fields' values before it, by attname. Nothing by default."""

    def refresh_from_db(self, using=None, fields=None, from_queryset=None):
        """Reload ``fields`` (default: every concrete field) from the database.

        Raises ``DoesNotExist`` if the row is gone.
        """
        if from_queryset is None and (using or self._state.db or DEFAULT_DB_ALIAS) == DEFAULT_DB_ALIAS:
            fresh = selects.select_one(type(self), {"pk": self.pk})  # the ORM's read, without building a queryset
        else:
            queryset = from_queryset if from_queryset is not None else type(self)._base_manager.all()
            fresh = queryset.using(using or self._state.db or DEFAULT_DB_ALIAS).get(pk=self.pk)
        wanted = set(fields) if fields else None
        for field in self._meta.concrete_fields:
            if wanted is None or field.name in wanted or field.attname in wanted:
                self.__dict__[field.attname] = fresh.__dict__[field.attname]
                if field.is_relation and field.is_cached(self):
                    field.delete_cached_value(self)
        self._update_initial_state()

    def insert_row(self) -> None:
        """Store this new instance in one statement (``runs.base.rows.insert``), as ``save()`` would."""
        rows.insert(self)
        self._update_initial_state()

    def update_row(self, fields: list[str]) -> None:
        """Write ``fields`` (names) in one UPDATE, as ``save(update_fields=fields)`` would, django-fsm's
        optimistic lock included: the row is written only if its state fields still hold the values
        this instance was loaded (or last saved) with.

        Raises ``ConcurrentTransition`` if they changed meanwhile, ``DatabaseError`` if the row is gone.
        """
        if not fields:
            return
        _, fields, expected = self.row_write(fields)
        if rows.update(self, fields, expected=expected) != 1:
            raise self.refused_write()
        self._update_initial_state()

    def row_write(self, fields: list[str]) -> tuple:
        """``(self, fields, expected)``: the write ``update_row(fields)`` makes, for a caller that sends it within
        another statement (``runs.base.rows.update_and_insert_numbered``'s ``also``); once it is written, call
        ``_update_initial_state()``, else raise ``refused_write()``."""
        return self, fields, dict(self._ConcurrentTransitionMixin__initial_states)  # django-fsm's own record

    def refused_write(self) -> Exception:
        """What a refused ``row_write`` means: ``ConcurrentTransition`` (its state changed since it was loaded),
        or ``DatabaseError`` if the row is gone (one query)."""
        if type(self)._base_manager.filter(pk=self.pk).exists():
            return ConcurrentTransition(
                f"{type(self).__name__} {self.pk}: its state changed since it was loaded; not saved")
        return DatabaseError(f"{type(self).__name__} {self.pk} is gone; not saved")
