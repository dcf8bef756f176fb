"""``Idempotency-Key`` for every mutating POST of the REST API, implemented once (``IdempotentPostMixin``).

A client that may send a request twice (a timeout, a retry) sends a key
of its own with it (1 to 200 printable ASCII characters). The rules, as
in Stripe's and the IETF draft "The Idempotency-Key HTTP Header Field":

* scope: one user and one endpoint (its URL name, e.g. ``api:interrupt-approve``);
  the same key on another endpoint is another key;
* same key, same request (sha256 of the method, the path and the body as
  canonical JSON; a multipart file by its name, size and sha256): the stored answer is replayed, status and body, with the
  header ``Idempotent-Replayed: true``; the request is not carried out again;
* same key, different request (another body, or another object of the
  same endpoint): 422 ``idempotency_key_reused``;
* same key while the first request is still being handled: 409
  ``idempotency_key_in_use`` at once (no waiting); the insert of the
  ``runs.models.IdempotentRequest`` row under its unique constraint decides
  which request runs, so two concurrent sends are carried out once;
* only successful (2xx) answers are stored: an error releases the key,
  so the request can be corrected or sent again with it;
* a key lives ``API_IDEMPOTENCY_TTL_HOURS`` (24) after its first use;
  expired keys of a user are deleted when that user next sends one. A key
  whose request died with its server process (no answer stored after
  ``STALE_AFTER``) is taken over by the next request with it.

Run creation also keeps its own key on the run (``Run.idempotency_key``,
``runs.engine.lifecycle.submit_input``), which outlives the 24 hours.
"""

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction
from django.http import QueryDict
from django.utils import timezone
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from runs.base.errors import IdempotencyKeyInUse, IdempotencyKeyReused
from runs.models import IdempotentRequest

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_MAX_LENGTH = IdempotentRequest._meta.get_field("key").max_length
# A key held this long without a stored answer belongs to a request that died.
STALE_AFTER = timedelta(minutes=5)


def request_key(request) -> str | None:
    """The request's ``Idempotency-Key``, or None without one; raises ``ValidationError`` (400) for a bad one."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not (1 <= len(key) <= KEY_MAX_LENGTH and key.isascii() and key.isprintable()):
        raise ValidationError({IDEMPOTENCY_HEADER: [
            f"Must be 1 to {KEY_MAX_LENGTH} printable ASCII characters."]})
    return key


def _file_digest(upload) -> dict:
    """An uploaded file as the fingerprint sees it: name, size and sha256 of the content (read, then rewound)."""
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)
    return {"file": upload.name, "size": upload.size, "sha256": digest.hexdigest()}


def fingerprint(request) -> str:
    """sha256 (hex) of the method, the path and the body as canonical JSON (sorted keys, no spaces).

    A multipart body counts with its form fields and, for each file, its
    name, size and the sha256 of its content: the same file sent again is
    the same request, another file is another.
    """
    data = request.data
    if isinstance(data, QueryDict):
        data = {name: [_file_digest(value) if isinstance(value, UploadedFile) else value for value in values]
                for name, values in data.lists()}
    canonical = json.dumps([request.method, request.path, data], sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def claim(*, user, scope: str, key: str, fingerprint: str) -> tuple[IdempotentRequest, bool]:
    """The key's row and whether this request now holds it (True: carry the request out).

    Inserts the row (the unique constraint lets one concurrent request win);
    else returns the row found, after deleting the user's expired keys and
    taking over a stale one sent with the same request. Raises
    ``IdempotencyKeyInUse`` if the key kept changing hands meanwhile.
    """
    for _ in range(3):
        now = timezone.now()
        IdempotentRequest.objects.filter(user=user, expires_at__lte=now).delete()
        try:
            with transaction.atomic():
                ttl = timedelta(hours=settings.API_IDEMPOTENCY_TTL_HOURS)
                return IdempotentRequest.objects.create(user=user, scope=scope, key=key, fingerprint=fingerprint,
                                                        started_at=now, expires_at=now + ttl), True
        except IntegrityError:
            pass
        record = IdempotentRequest.objects.filter(user=user, scope=scope, key=key).first()
        if record is None:
            continue  # released meanwhile
        stale = record.response_status is None and record.started_at <= now - STALE_AFTER
        if not (stale and record.fingerprint == fingerprint):
            return record, False
        if IdempotentRequest.objects.filter(pk=record.pk, response_status__isnull=True,
                                            started_at=record.started_at).update(started_at=now):
            return record, True
    raise IdempotencyKeyInUse()


class IdempotentPostMixin:
    """For API views: every POST honours ``Idempotency-Key`` (module doc); other methods are untouched.

    Wraps the POST handler after authentication, permissions and throttles
    (``initial``), so keys are per authenticated user and a throttled or
    refused request never takes one. ``self.idempotency_key`` is the
    request's key (None without one), for views that also pass it on.
    """

    idempotency_key = None

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if request.method == "POST":
            self.idempotency_key = request_key(request)
            if self.idempotency_key is not None:
                handler = self.post
                self.post = lambda request, *a, **kw: self._post_once(handler, request, *a, **kw)

    def _post_once(self, handler, request, *args, **kwargs):
        """Carry the request out once per key: replay the stored answer, or refuse a different request."""
        digest = fingerprint(request)
        record, holder = claim(user=request.user, scope=request.resolver_match.view_name, key=self.idempotency_key,
                               fingerprint=digest)
        if not holder:
            if record.fingerprint != digest:
                raise IdempotencyKeyReused()
            if record.response_status is None:
                raise IdempotencyKeyInUse()
            return Response(record.response_body, status=record.response_status, headers={REPLAYED_HEADER: "true"})
        try:
            response = handler(request, *args, **kwargs)
        except BaseException:
            record.delete()
            raise
        if 200 <= response.status_code < 300:
            IdempotentRequest.objects.filter(pk=record.pk).update(response_status=response.status_code,
                                                                  response_body=response.data)
        else:
            record.delete()
        return response
