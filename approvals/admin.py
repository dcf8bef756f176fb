"""Django admin for the inbox (docs/design.md#surfaces).

Inbox items are view-only; "Approve" and "Reject" are admin actions that call
``approvals.services.decide_interrupt``, which checks the item's permission
and the requester rule, resolves the tool call and resumes the run.
"""

from django.contrib import admin, messages
from django.utils.translation import gettext as _, gettext_lazy, ngettext
from django_fsm import ConcurrentTransition, TransitionNotAllowed

from approvals.models import Decision, Interrupt, InterruptKind
from approvals.services import decide_interrupt
from config.error_display import admin_error
from runs.admin import ReadOnlyAdminMixin
from runs.errors import TollgateError
from runs.labels import label


@admin.register(Interrupt)
class InterruptAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Inbox items, view-only; approve or reject them with the actions.

    The actions are offered to everyone who may see the list: whether a
    user may decide a given item is ``decide_interrupt``'s call (its
    ``required_permission`` and ``allow_requester``), and a refusal is
    reported per item.
    """

    list_display = (
        "id", "kind", "status", "title", "run", "tool_call", "requested_by", "decision", "resolved_by",
        "created_at", "expires_at",
    )
    list_filter = ("kind", "status", "decision", "required_permission", "run__agent")
    search_fields = ("=id", "=run__id", "title", "comment", "required_permission", "run__requested_by__username")
    list_select_related = ("run__requested_by", "tool_call", "resolved_by")
    date_hierarchy = "created_at"
    actions = ["approve_selected", "reject_selected"]

    @admin.display(description=gettext_lazy("requested by"), ordering="run__requested_by__username")
    def requested_by(self, interrupt: Interrupt):
        return interrupt.run.requested_by

    @admin.action(description=gettext_lazy("Approve selected items"))
    def approve_selected(self, request, queryset):
        """Approve each selected approval item via ``decide_interrupt``."""
        self._decide(request, queryset, Decision.APPROVED)

    @admin.action(description=gettext_lazy("Reject selected items"))
    def reject_selected(self, request, queryset):
        """Reject each selected approval item via ``decide_interrupt``."""
        self._decide(request, queryset, Decision.REJECTED)

    def _decide(self, request, queryset, decision: str) -> None:
        done = 0
        for interrupt in queryset.select_related("run", "tool_call").order_by("pk"):
            if interrupt.kind != InterruptKind.APPROVAL:
                self.message_user(
                    request,
                    _("Item %(item)s is of kind “%(kind)s”; only approval items can be decided here.")
                    % {"item": interrupt.pk, "kind": label(interrupt.kind)},
                    level=messages.WARNING,
                )
                continue
            try:
                decide_interrupt(interrupt=interrupt, user=request.user, decision=decision, comment="via admin")
            except (TransitionNotAllowed, ConcurrentTransition):
                status = Interrupt.objects.values_list("status", flat=True).get(pk=interrupt.pk)
                self.message_user(
                    request, _("Item %(item)s was not %(decision)s: it is %(status)s.")
                    % {"item": interrupt.pk, "decision": label(decision), "status": label(status)},
                    level=messages.WARNING,
                )
            except TollgateError as exc:
                admin_error(self, request, exc, _("Item %(item)s was not %(decision)s: %(error)s"),
                            item=interrupt.pk, decision=label(decision))
            else:
                done += 1
        if done:
            done_message = (ngettext("Approved %(count)d item.", "Approved %(count)d items.", done)
                            if decision == Decision.APPROVED
                            else ngettext("Rejected %(count)d item.", "Rejected %(count)d items.", done))
            self.message_user(request, done_message % {"count": done}, level=messages.SUCCESS)
