"""Opening a session (a conversation thread) on its own, before its first run.

``runs.engine.lifecycle.submit_input`` opens one implicitly for a run
without a session; ``open_session`` is for clients that want to name the
thread and attach their own metadata first (``POST /api/sessions/``).
"""

import json

from django.conf import settings

from config.strict_json import StrictJSONError, check_value
from runs.engine.agents import version_for_new_work
from runs.base.errors import InvalidInput
from runs.models import Agent, Session


def open_session(*, user, agent: Agent, title: str = "", metadata: dict | None = None) -> Session:
    """A new session of ``agent`` owned by ``user``, with the current version of its slug.

    ``title``: at most 200 characters (surrounding spaces dropped).
    ``metadata``: a JSON object of the client's, at most
    ``TOLLGATE["MAX_SESSION_METADATA_BYTES"]`` bytes as compact UTF-8 JSON,
    within ``config.strict_json``'s limits (depth, NUL, finite numbers).
    Raises ``InvalidInput`` naming the field otherwise, ``AgentArchived`` (409)
    for an archived agent (``runs.engine.agents.version_for_new_work``).
    """
    title = (title or "").strip()
    metadata = {} if metadata is None else metadata
    limit_title = Session._meta.get_field("title").max_length
    if len(title) > limit_title:
        raise InvalidInput.for_fields({"title": f"Title is {len(title)} characters; the limit is {limit_title}."})
    if not isinstance(metadata, dict):
        raise InvalidInput.for_fields({"metadata": "Must be a JSON object."})
    try:
        check_value(metadata)
    except StrictJSONError as exc:
        raise InvalidInput.for_fields({"metadata": str(exc)}) from None
    size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())
    limit = settings.TOLLGATE["MAX_SESSION_METADATA_BYTES"]
    if size > limit:
        raise InvalidInput.for_fields({"metadata": f"Metadata is {size} bytes as JSON; the limit is {limit}."})
    return Session.objects.create(owner=user, agent=version_for_new_work(agent), title=title, metadata=metadata)
