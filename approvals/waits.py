"""The ``input`` kind of wait: a question to a person, asked as an inbox item of kind ``input``
(docs/design.md#waits).

The approvals app owns the question, so it declares the kind (registered
when the app is ready, ``approvals.apps``); the tools app names it by its
value (``ask_user``) without importing this app. The answer settles the
wait (``approvals.services.answer_interrupt``); at the deadline the item
expires and the call fails.
"""

from approvals.services import expire_input_item, request_input
from runs.models import WaitingReason
from tools.waits import WaitKind, register_wait_kind


def _ask(wait, spec) -> None:
    """Open the question's inbox item; it expires at the wait's deadline."""
    request_input(tool_call=wait.tool_call, title=spec.title, expires_at=spec.deadline)


def _expire(tx, wait, *, now, actor: str) -> None:
    """The question was not answered in time: its item expires (under the run's lock, ``tx``)."""
    expire_input_item(tx, tool_call=wait.tool_call, now=now, actor=actor)


INPUT = register_wait_kind(WaitKind(
    name=WaitingReason.INPUT,
    inbox_item=True,
    open=_ask,
    on_timeout=_expire,
    timeout_error="No answer came before the question expired.",
))
