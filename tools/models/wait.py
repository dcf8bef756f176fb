"""Waits and the external events that settle them (docs/design.md#waits); ``tools.waits`` writes them.

The models moved here from the runs app in issue 24 with their tables
(``runs_wait``, ``runs_externalevent``) and rows: runs 0019 and tools 0012
move only Django's state.
"""

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from config.strict_json import StoredJSONDecoder
from runs.base.labels import choice


class WaitStatus(models.TextChoices):
    PENDING = choice("pending")  # the run waits for it
    DONE = choice("done")  # answered, received, or the time came: ``result`` is the tool call's result
    TIMED_OUT = choice("timed_out")  # nothing came by ``deadline``: the tool call fails with ``error``
    REFUSED = choice("refused")  # could not be opened (e.g. the event key is taken): the call fails with ``error``
    CANCELLED = choice("cancelled")  # the run ended first


class Wait(models.Model):
    """What a run waits for on behalf of one tool call of a waiting tool (``Tool.wait``, e.g. ``tools.builtin``).

    ``kind`` is a registered kind of wait (``tools.waits.WaitKind``) and the
    run's waiting reason while it waits, e.g. ``input`` (a person's answer
    to an inbox item of kind ``input``), ``external_event`` (a ``POST
    /api/events/`` with ``event_type`` and ``correlation_key``) or
    ``scheduled`` (the time ``deadline``). ``deadline`` is also the run's
    ``wake_at``: the sweeper ends the wait then (docs/design.md#waits).
    ``status`` is a plain field written with conditional updates under the
    run's row lock (``tools.waits.settle_wait``); no FSM. While pending, an
    event type + key pair belongs to one wait only.
    """

    run = models.ForeignKey("runs.Run", verbose_name=_("run"), on_delete=models.CASCADE, related_name="waits")
    tool_call = models.OneToOneField("tools.ToolCall", verbose_name=_("tool call"), on_delete=models.CASCADE,
                                     related_name="wait")
    # No choices: a registered kind of wait (is_wait_kind), checked by tools.waits.open_wait.
    kind = models.CharField(_("kind"), max_length=32)
    status = models.CharField(_("status"), max_length=16, choices=WaitStatus.choices, default=WaitStatus.PENDING,
                              db_index=True)
    event_type = models.CharField(_("event type"), max_length=100, blank=True)
    correlation_key = models.CharField(_("correlation key"), max_length=200, blank=True)
    deadline = models.DateTimeField(_("deadline"),
                                    help_text=_("When the wait ends: the time itself (scheduled), else its timeout."))
    result = models.JSONField(_("result"), null=True, blank=True, help_text=_("The tool call's result once done."),
                              decoder=StoredJSONDecoder)
    error = models.TextField(_("error"), blank=True, help_text=_("Why the tool call fails (timed out, refused)."))
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    settled_at = models.DateTimeField(_("settled at"), null=True, blank=True)

    class Meta:
        db_table = "runs_wait"  # kept from the runs app, where the model was until issue 24
        verbose_name = _("wait")
        verbose_name_plural = _("waits")
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["event_type", "correlation_key"],
                condition=models.Q(status="pending", kind="external_event"),
                name="one_pending_wait_per_event_key",
            ),
        ]

    def __str__(self):
        return f"{self.kind} wait {self.pk} of run {self.run_id} ({self.status})"


class ExternalEvent(models.Model):
    """An event an outside system delivered to a waiting run (``POST /api/events/``).

    ``(type, key)`` is unique: the first delivery is stored and resumes the
    run; a repeat changes nothing. ``payload`` became the waiting tool
    call's result.
    """

    type = models.CharField(_("type"), max_length=100)
    key = models.CharField(_("key"), max_length=200)
    payload = models.JSONField(_("payload"), default=dict, blank=True, decoder=StoredJSONDecoder)
    run = models.ForeignKey("runs.Run", verbose_name=_("run"), on_delete=models.CASCADE,
                            related_name="external_events")
    wait = models.OneToOneField(Wait, verbose_name=_("wait"), on_delete=models.CASCADE, related_name="event")
    received_by = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("received by"), on_delete=models.PROTECT,
                                    related_name="+")
    received_at = models.DateTimeField(_("received at"), auto_now_add=True)

    class Meta:
        db_table = "runs_externalevent"  # kept from the runs app, where the model was until issue 24
        verbose_name = _("external event")
        verbose_name_plural = _("external events")
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["type", "key"], name="external_event_type_key")]

    def __str__(self):
        return f"event {self.type} ({self.pk}) for run {self.run_id}"
