"""Forms of the inbox pages. Their JSON fields are read with ``config.strict_json``."""

from datetime import UTC, date, datetime, time, timedelta

from django import forms
from django.utils import timezone
from django.utils.translation import gettext, gettext_lazy as _

from approvals.models import Decision, NotificationPreference
from config.strict_json import StrictJSONError, loads


class DecisionForm(forms.Form):
    """Approve or reject an approval item, with a comment.

    ``edited_arguments`` is optional JSON (an object) used only when
    approving; left empty or unchanged, the model's arguments stand.
    """

    decision = forms.ChoiceField(choices=[("approved", _("Approve")), ("rejected", _("Reject"))])
    comment = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}), max_length=5000)
    edited_arguments = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}))

    def __init__(self, *args, original_arguments=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.original_arguments = original_arguments

    def clean(self):
        cleaned = super().clean()
        raw = (cleaned.get("edited_arguments") or "").strip()
        cleaned["parsed_arguments"] = None
        if cleaned.get("decision") != "approved" or not raw:
            return cleaned
        try:
            parsed = loads(raw)
        except StrictJSONError as exc:
            self.add_error("edited_arguments", str(exc))
            return cleaned
        if not isinstance(parsed, dict):
            self.add_error("edited_arguments", gettext("The arguments must be a JSON object."))
            return cleaned
        if parsed != self.original_arguments:
            cleaned["parsed_arguments"] = parsed
        return cleaned


class ReconcileForm(forms.Form):
    """Settle an unknown outcome: did the call happen? ``evidence`` says what was checked.

    ``result`` is optional JSON: what the external system reports, used as
    the call's result when it succeeded.
    """

    outcome = forms.ChoiceField(choices=[("succeeded", _("It happened")), ("failed", _("It did not happen"))])
    evidence = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=5000)
    result = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}))

    def clean_result(self):
        raw = (self.cleaned_data.get("result") or "").strip()
        if not raw:
            return None
        try:
            return loads(raw)
        except StrictJSONError as exc:
            raise forms.ValidationError(str(exc)) from None


class AnswerForm(forms.Form):
    """Answer a question (an input item): free text or one of its options, with a file when it allows one.

    ``approvals.services.answer_interrupt`` checks the options, that there is an answer or a file, and the file.
    """

    answer = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=10_000, required=False)
    file = forms.FileField(required=False, allow_empty_file=True)


class InboxFilterForm(forms.Form):
    """The inbox list's query string: sort, filters, search and the keyset cursor, validated.

    Every field is optional; an invalid one makes the page answer 400 with
    the form's errors. ``after`` is the id of the last item of the previous
    page, ``page`` only the number shown (1 + pages turned).
    """

    SEARCH_CHARS = 100  # a search is one short phrase: bounded work per row

    sort = forms.ChoiceField(required=False, label=_("Sort"), choices=[
        ("expiry", _("Expiring soonest")), ("oldest", _("Oldest first")), ("newest", _("Newest first"))])
    kind = forms.ChoiceField(required=False, label=_("Kind"))
    tool = forms.ChoiceField(required=False, label=_("Tool"))
    agent = forms.ChoiceField(required=False, label=_("Agent"))
    requester = forms.CharField(required=False, label=_("Requester"), max_length=150)
    assigned = forms.ChoiceField(required=False, label=_("Assigned"), choices=[("", _("anyone")), ("me", _("to me"))])
    q = forms.CharField(required=False, label=_("Search"), max_length=SEARCH_CHARS)
    after = forms.IntegerField(required=False, min_value=1, max_value=2 ** 63 - 1, widget=forms.HiddenInput)
    page = forms.IntegerField(required=False, min_value=1, max_value=10 ** 9, widget=forms.HiddenInput)

    def __init__(self, *args, kinds=(), tools=(), agents=(), **kwargs):
        """``kinds``: ``[(value, label)]``; ``tools`` / ``agents``: names and slugs offered."""
        super().__init__(*args, **kwargs)
        anything = [("", gettext("any"))]
        self.fields["kind"].choices = anything + list(kinds)
        self.fields["tool"].choices = anything + [(name, name) for name in tools]
        self.fields["agent"].choices = anything + [(slug, slug) for slug in agents]


class DecidedFilterForm(forms.Form):
    """Filters and keyset cursor of the history page (``approvals.selectors.decided_page``); every field optional.

    ``when``: ``today``, or empty to use ``day_from`` / ``day_to``.
    ``after`` / ``before``: the id of the last / first item of the page one
    came from (one of them at most); ``page`` only the number shown.
    """

    who = forms.ChoiceField(required=False, choices=[("", _("anyone")), ("me", _("me"))], label=_("Decided by"))
    decision = forms.ChoiceField(required=False, label=_("Decision"))
    tool = forms.CharField(required=False, max_length=100, label=_("Tool"))
    when = forms.ChoiceField(required=False, choices=[("", _("any day")), ("today", _("today"))], label=_("When"))
    day_from = forms.DateField(required=False, label=_("From"), widget=forms.DateInput(attrs={"type": "date"}))
    day_to = forms.DateField(required=False, label=_("To"), widget=forms.DateInput(attrs={"type": "date"}))
    after = forms.IntegerField(required=False, min_value=1, max_value=2 ** 63 - 1, widget=forms.HiddenInput)
    before = forms.IntegerField(required=False, min_value=1, max_value=2 ** 63 - 1, widget=forms.HiddenInput)
    page = forms.IntegerField(required=False, min_value=1, max_value=10 ** 9, widget=forms.HiddenInput)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["decision"].choices = [("", _("any"))] + list(Decision.choices)

    def clean_day_from(self):
        return _day_in_range(self.cleaned_data.get("day_from"))

    def clean_day_to(self):
        return _day_in_range(self.cleaned_data.get("day_to"))

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("after") and cleaned.get("before"):
            raise forms.ValidationError(gettext("Give at most one of after and before."))
        return cleaned


def _day_in_range(day: date | None) -> date | None:
    """``day`` if the whole day, in the current time zone, is a span UTC can hold; else a ``ValidationError``.

    A day is filtered on as ``[its start, the next day's start)`` in UTC:
    ``9999-12-31`` has no next day, and ``0001-01-01`` starts before UTC's
    first moment east of Greenwich.
    """
    if day is None:
        return None
    try:
        start = timezone.make_aware(datetime.combine(day, time.min))
        (start + timedelta(days=1)).astimezone(UTC)
        start.astimezone(UTC)
    except OverflowError:
        raise forms.ValidationError(gettext("This date is out of range."), code="invalid") from None
    return day


class BulkDecisionForm(forms.Form):
    """The confirmation page's answer: ``decision`` and one ``comment`` for every item listed.

    The items and their fingerprints come as ``item`` / ``fingerprint-<id>``
    fields, read by ``expected``.
    """

    decision = forms.ChoiceField(choices=[("approved", _("Approve")), ("rejected", _("Reject"))])
    comment = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}), max_length=5000)

    def expected(self) -> dict[str, str]:
        """``{item id (as sent): fingerprint}`` for each ``item`` field; the service checks the ids."""
        return {pk: self.data.get(f"fingerprint-{pk}", "") for pk in self.data.getlist("item")}


class NotificationPreferenceForm(forms.ModelForm):
    """Which emails a user wants, and in which language (``approvals.models.NotificationPreference``)."""

    class Meta:
        model = NotificationPreference
        fields = ["new_item", "claimed_expiring", "run_expired", "language"]
