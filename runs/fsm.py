"""The base of every state-machine model: optimistic locking, thread-safe reload.

django-fsm-2's ``FSMModelMixin.refresh_from_db`` lifts the protection of
protected state fields by flipping a flag on the *field*, which is shared by
every instance in the process; a worker with several threads reloading at
once then fails with "Direct status modification is not allowed". The
reload here writes the fresh values straight into the instance instead and
leaves the field's protection alone.
"""

from django.db import models
from django_fsm import ConcurrentTransitionMixin


class FSMModel(ConcurrentTransitionMixin, models.Model):
    """Abstract base: ``ConcurrentTransitionMixin`` plus a thread-safe ``refresh_from_db``."""

    class Meta:
        abstract = True

    def refresh_from_db(self, using=None, fields=None, from_queryset=None):
        """Reload ``fields`` (default: every concrete field) from the database.

        Raises ``DoesNotExist`` if the row is gone.
        """
        queryset = from_queryset if from_queryset is not None else type(self)._base_manager.all()
        fresh = queryset.using(using or self._state.db or "default").get(pk=self.pk)
        wanted = set(fields) if fields else None
        for field in self._meta.concrete_fields:
            if wanted is None or field.name in wanted or field.attname in wanted:
                self.__dict__[field.attname] = fresh.__dict__[field.attname]
                if field.is_relation and field.is_cached(self):
                    field.delete_cached_value(self)
        self._update_initial_state()
