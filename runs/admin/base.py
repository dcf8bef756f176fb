"""Pieces the admin modules share: read-only admins, one-line and folded values, paged inlines.

Used by ``runs.admin``, ``runs.admin.inlines``, ``tools.admin``,
``approvals.admin`` and ``runs.webhooks.admin``.
"""

import json

from django.contrib import admin
from django.contrib.admin.utils import display_for_field, flatten_fieldsets
from django.core.paginator import Paginator
from django.db.models import Model
from django.forms.models import BaseInlineFormSet
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy

from runs.base.labels import label
from runs.models import waiting_reason_choices

# Characters of the one-line preview of a folded JSON value.
PREVIEW_CHARS = 60


def all_fields(model: type[Model]) -> tuple[str, ...]:
    """Names of every concrete field of ``model``, in declaration order."""
    return tuple(field.name for field in model._meta.concrete_fields)


def truncated(text: str, length: int = 80) -> str:
    """``text`` on one line, cut to ``length`` characters for a changelist column."""
    return Truncator(" ".join((text or "").split())).chars(length)


def with_remaining_fields(fieldsets, model: type[Model], title=gettext_lazy("More")) -> tuple:
    """``fieldsets`` plus a last, folded section with every other non-key field of ``model``.

    Keeps a hand-arranged page complete when fields are added to the model.
    """
    listed = {name for _, options in fieldsets for name in options["fields"]}
    rest = tuple(f.name for f in model._meta.concrete_fields if not f.primary_key and f.name not in listed)
    return tuple(fieldsets) + (((title, {"fields": rest, "classes": ["collapse"]}),) if rest else ())


def folded_json(value) -> str:
    """``value`` (any JSON value) as safe HTML for an admin cell: short ones inline, long ones folded.

    A value whose one-line JSON fits in ``PREVIEW_CHARS`` characters is a
    ``<code>``; a longer one is a ``<details>`` whose summary is the cut
    one-line form and whose body is the whole value, indented. ``None``,
    ``""``, ``{}`` and ``[]`` give ``""``. Everything is escaped.
    """
    if value in (None, "", {}, []):
        return ""
    line = json.dumps(value, ensure_ascii=False, default=str)
    if len(line) <= PREVIEW_CHARS:
        return format_html("<code>{}</code>", line)
    return format_html('<details class="folded-json"><summary><code>{}</code></summary><pre>{}</pre></details>',
                       Truncator(line).chars(PREVIEW_CHARS), json.dumps(value, indent=2, ensure_ascii=False,
                                                                        default=str))


def column(field: str, description, *, as_word: bool = False) -> staticmethod:
    """An admin column (changelist or inline) showing the model field ``field`` under a translatable heading.

    The value is shown as the admin shows that field (datetimes with seconds
    in the request's zone, booleans as icons, ``-`` when empty); with
    ``as_word``, a machine value (a status, kind, reason) is shown as its page
    word (``runs.base.labels.label``). Sortable by the field. Assign it to a name
    in a ``ModelAdmin`` or inline class body and list that name.
    """

    @admin.display(description=description, ordering=field)
    def show(obj) -> str:
        value = getattr(obj, field)
        if as_word:
            return label(value)
        return display_for_field(value, obj._meta.get_field(field), admin.site.empty_value_display)

    show.__name__ = field
    return staticmethod(show)


class ReadOnlyAdminMixin:
    """View-only admin for records only the runtime writes: no add, change or delete.

    Every concrete field is shown read-only (including ``auto_now_add``
    timestamps, which a form would otherwise hide), and so is every
    computed column named in ``fields``. Works for ``ModelAdmin`` and
    inlines alike.
    """

    def get_readonly_fields(self, request, obj=None):
        concrete = all_fields(self.model)
        listed = self.fields or (flatten_fieldsets(self.fieldsets) if self.fieldsets else ())
        return concrete + tuple(name for name in listed if name not in concrete)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class PagedInlineFormSet(BaseInlineFormSet):
    """An inline formset over one page of its rows, so a parent with thousands of them stays a short page.

    ``per_page`` rows from page ``page_number`` (a query-string value,
    untrusted: anything that is not a page number gives the first or last
    page, as ``Paginator.get_page`` does); ``page`` is that
    ``django.core.paginator.Page``. Both attributes are set per request by
    ``PagedInlineMixin.get_formset``.
    """

    per_page = 50
    page_number = None
    page_param = "page"

    def get_queryset(self):
        if not hasattr(self, "_page"):
            self._page = Paginator(super().get_queryset(), self.per_page).get_page(self.page_number)
            self._queryset = self._page.object_list
        return self._queryset

    @property
    def page(self):
        """The page shown (reads the rows' count and the page on first use)."""
        self.get_queryset()
        return self._page


class PagedInlineMixin:
    """For a read-only tabular inline: show ``per_page`` rows at a time, with links to the other pages.

    The page is chosen by ``<prefix>_page`` in the change page's query
    string (``events_page=3``). ``site_anchor``, if set, adds a link to
    that part of the parent's page on the site (``get_absolute_url``).
    """

    formset = PagedInlineFormSet
    template = "admin/edit_inline/paged_tabular.html"
    per_page = 50
    site_anchor = ""

    def get_formset(self, request, obj=None, **kwargs):
        """The inline's formset class for this request, knowing its page size, query parameter and page asked for."""
        formset = super().get_formset(request, obj, **kwargs)
        formset.per_page = self.per_page
        formset.page_param = f"{formset.get_default_prefix()}_page"
        formset.page_number = request.GET.get(formset.page_param)
        return formset


class WaitingReasonFilter(admin.SimpleListFilter):
    """The run list's filter on what a run waits for: every waiting reason, registered kinds of wait
    included (``runs.models.waiting_reason_choices``), in the page's words (the field has no choices)."""

    parameter_name = "waiting_reason"

    def __init__(self, request, params, model, model_admin):
        self.title = model._meta.get_field("waiting_reason").verbose_name
        super().__init__(request, params, model, model_admin)

    def lookups(self, request, model_admin):
        """``[(value, word)]``: the waiting reasons."""
        return waiting_reason_choices()

    def queryset(self, request, queryset):
        """The runs waiting for the chosen reason, or all of them."""
        return queryset.filter(waiting_reason=self.value()) if self.value() else queryset


class AgentSlugFilter(admin.AllValuesFieldListFilter):
    """A list filter on an agent's slug (``("agent__slug", AgentSlugFilter)``): one choice per agent,
    matching every version of it, titled "agent"."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.title = gettext_lazy("agent")
