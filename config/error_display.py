"""How pages and the admin show the error family of ``runs.base.errors``: one mapping for people.

``config.api.exception_handler`` maps a ``TollgateError`` to a JSON answer;
this module maps the same error for the other surfaces, the same way:

* ``InvalidInput`` on a page with a form → the form shows its messages,
  each on its field (``details``), else on ``field`` or the whole form; the
  page answers 400 (``page_error`` returns None: re-render the form);
* any other ``TollgateError`` on a page (``Forbidden`` 403, ``Conflict`` 409,
  ``IdempotencyKeyReused`` 422, ``Throttled`` 429, ``InvalidInput`` without a form 400) → the
  status page (``templates/error.html``) with its ``http_status`` and message;
* in an admin action → ``message_user`` at level ERROR: a sentence saying
  what was not done, with the error's message in it (``admin_error``).

``error_page`` is the status page itself, also used for a clash with the
object's current state (``TransitionNotAllowed``), which each page words.
"""

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext_lazy

from runs.base.errors import InvalidInput, TollgateError

# The status page's title by HTTP status.
STATUS_TITLES = {400: gettext_lazy("Not possible"), 403: gettext_lazy("Not allowed"), 404: gettext_lazy("Not found"),
                 409: gettext_lazy("Not possible now"), 422: gettext_lazy("Not possible"),
                 429: gettext_lazy("Too many requests")}


def error_page(request, *, status: int, title: str, message: str, back_url: str, detail: str = "") -> HttpResponse:
    """The status page: ``title`` (with ``status``), ``message``, ``detail`` (HTML rendered from a
    template, e.g. who decided an item first) and a link to ``back_url``, answered with ``status``."""
    return render(request, "error.html", {"status": status, "title": title, "message": message, "detail": detail,
                                          "back_url": back_url}, status=status)


def show_in_form(form, exc: InvalidInput, *, field: str | None = None) -> None:
    """Put ``exc``'s messages on ``form``: by field from ``details``; a field the form lacks goes to
    ``field`` (None: the whole form), and so does the message when there are no details."""
    for name, problems in (exc.details or {field: [exc.message]}).items():
        form.add_error(name if name in form.fields else field, problems)


def page_error(request, exc: TollgateError, *, back_url: str, form=None, field: str | None = None) -> HttpResponse | None:
    """Show ``exc`` on a page. ``InvalidInput`` with a ``form``: on the form (see ``show_in_form``), returns
    None and the caller re-renders the form with 400. Otherwise the status page with ``exc.http_status``."""
    if form is not None and isinstance(exc, InvalidInput):
        show_in_form(form, exc, field=field)
        return None
    return error_page(request, status=exc.http_status, title=STATUS_TITLES.get(exc.http_status, STATUS_TITLES[400]),
                      message=exc.message, back_url=back_url)


def admin_error(model_admin, request, exc: TollgateError, message: str, **params) -> None:
    """Report ``exc`` from an admin action at level ERROR: ``message`` (translated, with ``%(error)s``
    where the error's message goes) filled with ``params``, e.g.
    ``_("Item %(item)s was not %(decision)s: %(error)s"), item=4, decision="approved"``."""
    model_admin.message_user(request, message % {**params, "error": exc.message}, level=messages.ERROR)
