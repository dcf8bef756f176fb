"""REST endpoints around waiting runs: deliver an external event, wait for a run's result.

* ``POST /api/events/`` {type, key, payload?}: any authenticated caller
  (token or session); the key is the capability. 201 with the stored event
  when it resumed a run, 200 (``duplicate``) when that type + key was
  delivered before (nothing changes), 404 when no run waits on it
  (``tools.waits.receive_event``).
* ``GET /api/runs/{id}/wait/?timeout=30``: the run, as ``GET
  /api/runs/{id}/`` shows it, as soon as it is waiting or has ended, or
  when ``timeout`` seconds (1 to 60) have passed; the header
  ``Wait-Timed-Out`` says ``true`` in that last case. An async view: while
  it waits it holds no thread. It listens on the run's Channels group
  (``runs.live``) and reads the run again on every update, and at the
  latest after a backoff of 50 ms doubling to 1 s, for updates the channel
  layer cannot carry (another process with the in-memory layer).
  Authentication is DRF's token or the session; another user's run is a
  404; the API's per-user throttle applies, and a 401 counts against the
  address's anonymous rate (429 over it). drf-spectacular only sees
  DRF views, so ``document_run_wait`` (a postprocessing hook) adds this
  one to ``/api/schema/``.
"""

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import error_body
from config.idempotency import IdempotentPostMixin
from config.throttles import UserRateThrottle, count_failed_authentication
from runs.live import run_group
from runs.models import RunStatus
from runs.selectors import run_get_visible
from runs.api.serializers import EventSerializer, ExternalEventSerializer, RunSerializer
from tools.waits import receive_event

log = logging.getLogger(__name__)

MAX_WAIT_TIMEOUT_S = 60
DEFAULT_WAIT_TIMEOUT_S = 30
FIRST_POLL_S = 0.05
MAX_POLL_S = 1.0
TIMED_OUT_HEADER = "Wait-Timed-Out"


class EventView(IdempotentPostMixin, APIView):
    """``POST /api/events/``: an outside system reports an event a run waits for (see module doc)."""

    @extend_schema(summary="Deliver an external event to the run waiting on its type and key",
                   request=EventSerializer,
                   responses={201: ExternalEventSerializer,
                              200: OpenApiResponse(ExternalEventSerializer,
                                                   description="Delivered before: nothing changed."),
                              400: OpenApiResponse(description="Bad type, key or payload (too large)."),
                              404: OpenApiResponse(description="No run waits on this type and key.")})
    def post(self, request):
        body = EventSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        received = receive_event(event_type=data["type"], key=data["key"], payload=data["payload"],
                                 user=request.user)
        answer = ExternalEventSerializer(received.event, context={"duplicate": not received.created})
        return Response(answer.data, status=status.HTTP_201_CREATED if received.created else status.HTTP_200_OK)


# --- GET /api/runs/{id}/wait/ ---------------------------------------------------------

def _db(fn):
    """``fn`` for async code: run in the shared thread pool (no thread per request), connections closed after."""
    return database_sync_to_async(fn, thread_sensitive=False)


class _ThrottleRequest:
    """What DRF's throttles read of a request: the user and the client address."""

    def __init__(self, request, user):
        self.user = user
        self.META = request.META


def _throttled(wait: float) -> JsonResponse:
    """429 as the rest of the API answers it: ``Retry-After`` and ``details.retry_after`` in whole seconds."""
    wait = int(wait or 0) + 1
    response = JsonResponse(error_body("throttled", f"Too many requests; try again in {wait} seconds.",
                                       {"retry_after": wait}), status=429)
    response["Retry-After"] = str(wait)
    return response


def _unauthorized(request, code: str, detail: str) -> JsonResponse:
    """401, counted against the address's anonymous rate (``count_failed_authentication``): over it, 429."""
    wait = count_failed_authentication(request)
    if wait is not None:
        return _throttled(wait)
    response = JsonResponse(error_body(code, detail), status=401)
    response["WWW-Authenticate"] = TokenAuthentication().authenticate_header(None)
    return response


@_db
def _authenticate_and_throttle(request):
    """(user, error response): the token's user, else the session's; 401 / 429 as the rest of the API answers."""
    try:
        found = TokenAuthentication().authenticate(request)
    except AuthenticationFailed as exc:
        return None, _unauthorized(request, "authentication_failed", str(exc.detail))
    user = found[0] if found else request.user
    if not user.is_authenticated:
        return None, _unauthorized(request, "not_authenticated", "Authentication credentials were not provided.")
    throttle = UserRateThrottle()
    if not throttle.allow_request(_ThrottleRequest(request, user), None):
        return None, _throttled(throttle.wait())
    return user, None


@_db
def _load(user, run_id: int) -> tuple[dict | None, bool]:
    """(the run's API representation or None if not visible, whether it is waiting or has ended)."""
    run = run_get_visible(user=user, run_id=run_id)
    if run is None:
        return None, False
    settled = run.status == RunStatus.WAITING or run.is_terminal
    return RunSerializer(run).data, settled


def _timeout_s(request) -> int | None:
    raw = request.GET.get("timeout")
    if raw is None:
        return DEFAULT_WAIT_TIMEOUT_S
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3) or not 1 <= int(raw) <= MAX_WAIT_TIMEOUT_S:
        return None
    return int(raw)


class _Updates:
    """The run's Channels group as an async signal source; a broken layer only means more polling."""

    def __init__(self, run_id: int):
        self.group = run_group(run_id)
        self.layer = get_channel_layer()
        self.channel = None

    async def __aenter__(self):
        if self.layer is not None:
            try:
                self.channel = await self.layer.new_channel()
                await self.layer.group_add(self.group, self.channel)
            except Exception:
                log.warning("wait: channel layer unavailable; polling only", exc_info=True)
                self.channel = None
        return self

    async def __aexit__(self, *exc):
        if self.channel is not None:
            try:
                await self.layer.group_discard(self.group, self.channel)
            except Exception:
                log.warning("wait: could not leave %s", self.group, exc_info=True)

    async def next(self, timeout: float) -> None:
        """Return after an update of the run or ``timeout`` seconds, whichever comes first."""
        if self.channel is None:
            await asyncio.sleep(timeout)
            return
        try:
            await asyncio.wait_for(self.layer.receive(self.channel), timeout)
        except TimeoutError:
            pass
        except Exception:
            log.warning("wait: channel layer failed; polling only", exc_info=True)
            self.channel = None
            await asyncio.sleep(timeout)


@csrf_exempt  # it only reads, and refuses every other method itself (else CSRF's HTML 403 came first)
async def run_wait(request, run_id: int):
    """``GET /api/runs/{id}/wait/?timeout=``: the run once it is waiting or has ended, or at the timeout (see module doc).

    Any other method is a 405 in the API's error shape, with ``Allow: GET``.
    """
    if request.method != "GET":
        response = JsonResponse(error_body("method_not_allowed", f"Method {request.method!r} not allowed."),
                                status=405)
        response["Allow"] = "GET"
        return response
    user, refused = await _authenticate_and_throttle(request)
    if refused is not None:
        return refused
    timeout = _timeout_s(request)
    if timeout is None:
        message = f"Must be a whole number of seconds from 1 to {MAX_WAIT_TIMEOUT_S}."
        return JsonResponse(error_body("invalid", message, {"fields": {"timeout": [message]}}), status=400)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with _Updates(run_id) as updates:  # joined before the first read, so no update slips between
        data, settled = await _load(user, run_id)
        pause = FIRST_POLL_S
        while data is not None and not settled and (left := deadline - loop.time()) > 0:
            await updates.next(min(pause, left))
            pause = min(pause * 2, MAX_POLL_S)
            data, settled = await _load(user, run_id)
    if data is None:
        return JsonResponse(error_body("not_found", "No such run."), status=404)
    response = JsonResponse(data)
    response[TIMED_OUT_HEADER] = "false" if settled else "true"
    return response


# --- the wait endpoint in /api/schema/ ---------------------------------------------------

WAIT_PATH = "/api/runs/{run_id}/wait/"
WAIT_OPERATION = {
    "operationId": "runs_wait",
    "summary": "Wait until the run is waiting or has ended",
    "description": ("Answers with the run (as `GET /api/runs/{id}/`) as soon as it is waiting or has ended, or "
                    f"when `timeout` seconds have passed; the `{TIMED_OUT_HEADER}` header says which."),
    "tags": ["runs"],
    "parameters": [
        {"in": "path", "name": "run_id", "required": True, "schema": {"type": "integer"},
         "description": "The run's id."},
        {"in": "query", "name": "timeout", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": MAX_WAIT_TIMEOUT_S,
                    "default": DEFAULT_WAIT_TIMEOUT_S},
         "description": "Longest wait in seconds."},
    ],
    "responses": {
        "200": {
            "description": "The run, waiting or ended, or as it is at the timeout.",
            "headers": {TIMED_OUT_HEADER: {
                "required": True, "schema": {"type": "string", "enum": ["true", "false"]},
                "description": "`true`: the timeout passed before the run was waiting or ended."}},
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}},
        },
    },
}


def document_run_wait(result, generator, request, public):
    """drf-spectacular postprocessing hook: add ``GET /api/runs/{run_id}/wait/`` (``WAIT_OPERATION``) to the document.

    The operation's security is that of ``GET /api/runs/{id}/`` (the same
    authentication); the error statuses are added by
    ``config.api_schema.document_errors_and_idempotency``, which runs after.
    """
    paths = result.setdefault("paths", {})
    retrieve = paths.get("/api/runs/{id}/", {}).get("get", {})
    operation = {**WAIT_OPERATION, **({"security": retrieve["security"]} if "security" in retrieve else {})}
    paths[WAIT_PATH] = {"get": operation}
    result["paths"] = dict(sorted(paths.items()))
    return result
