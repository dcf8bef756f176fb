"""A row per approval-rule scope, locked while a cumulative rule is judged."""

from django.db import models
from django.utils.translation import gettext_lazy as _


class PolicyLock(models.Model):
    """One scope of a cumulative approval rule, e.g. the refunds of one order.

    ``key`` names it (``tools.services`` derives it from the tool, the
    scope and the run, user or target). Proposals that count calls in a
    scope first lock its row (``select_for_update``), so two concurrent
    proposals cannot both be judged without the other's call.

    For a target (``tools.services.targets``), ``holder`` is the call that
    claimed it to be checked and sent; the claim counts while that call is
    ``ready`` or ``running``, and its outcome clears it. ``waiters`` says
    that a call found the target held and its run waits for the holder's
    outcome: set by that claim, cleared by the release that wakes them, so
    that a release with no one waiting looks for no waiter.
    """

    key = models.CharField(_("key"), max_length=100, unique=True)
    holder = models.ForeignKey("tools.ToolCall", verbose_name=_("holder"), null=True, blank=True,
                               on_delete=models.SET_NULL, related_name="+",
                               help_text=_("The call that holds this target from its precondition check until its "
                                           "outcome."))
    waiters = models.BooleanField(_("waiters"), default=False, db_default=False,
                                  help_text=_("Whether a run waits for this target's holder (its call found the "
                                              "target held)."))

    class Meta:
        verbose_name = _("policy lock")
        verbose_name_plural = _("policy locks")

    def __str__(self):
        return self.key
