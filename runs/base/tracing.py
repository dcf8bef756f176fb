"""OpenTelemetry traces of runs, off unless the standard ``OTEL_*`` variables turn them on.

One trace per run, whatever process works on it: the trace id (and the id
of a virtual root span, the run itself) is derived from the run's id and
creation time (``run_context``), so a worker, another worker after a
crash and the server that takes a decision all put their spans in the
same trace without passing anything through the broker or storing it.
The root is virtual: no span with its id is ever exported (a trace viewer
may say the root is missing).

Spans, following OpenTelemetry's GenAI semantic conventions where they
have a name for it:

* ``chat <model>`` per model call (``gen_ai.operation.name``,
  ``gen_ai.provider.name``, ``gen_ai.request.model``,
  ``gen_ai.usage.input_tokens``/``output_tokens``,
  ``gen_ai.response.finish_reasons``, ``gen_ai.conversation.id``: the
  session);
* ``execute_tool <tool>`` per tool call executed (``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``tollgate.tool.side_effect``,
  ``tollgate.tool.attempts``, ``tollgate.tool.outcome``);
* ``approval wait`` from an approval item's creation to its decision, with
  a ``decision`` span (``tollgate.decision``) at its end;
* ``<reason> wait`` for the run's other waits (``retry_backoff``,
  ``scheduled``, ``external_event``, ``input``, ``reconciliation``: its
  ``waiting_reason``), from the moment it went to wait (or, for a run
  created with ``start_at``, its creation) to the moment it went on or
  ended (``record_wait``).

Libraries: with traces on, the official instrumentations of Django (a
server span per request), psycopg (a span per query), httpx and aiohttp's
client (a span per request) are turned on too (``instrument_libraries``). The run's work in a
worker happens in the run's trace: the ids of the run's context
(``runs.base.log_context``, shared by every thread of the slice) carry the
OpenTelemetry context it is under (``log_ids``: the run's root, or the
model call's or tool call's span while one is open), and ``attached``
makes it current where the engine runs a step's database work and starts
its calls (``runs.base.awaiting``). So a tool's HTTP requests are children of
its ``execute_tool`` span and the slice's queries children of the run (or
of the call under way). A query made outside any request, run or span (the
heartbeat, the lease keeper, the sweeper) is not exported
(``WithoutLoneQueries``): each would be a trace of one span every few
seconds. The model SDKs speak ``httpx2``, which no official
instrumentation covers: a model call is its ``chat`` span alone.

Prompt and completion text are recorded only when an operator turns it on
(``TOLLGATE_TRACE_CONTENT=true``: ``gen_ai.input.messages`` and
``gen_ai.output.messages`` on the model-call span, JSON text with
credentials masked as in logs, ``runs.base.masking.mask_log_text``); tool
arguments and results never are. Errors are recorded by type
(``error.type``), never by message (a provider's message may quote a key).
A run's log lines carry its trace id (``trace_id_hex``) while traces are
recorded, so a line leads to its trace.

``configure_from_environment`` (when the ``runs`` app is ready) installs
the SDK's tracer provider when ``OTEL_TRACES_EXPORTER`` (``otlp``,
``console``) or an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` is set and
``OTEL_SDK_DISABLED`` is not ``true``; the SDK and the OTLP exporter are
the optional ``otel`` dependencies. Otherwise every function here costs a
type check and records nothing.
"""

import contextlib
import hashlib
import json
import logging
import os

from django.conf import settings

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from runs.base import log_context

log = logging.getLogger(__name__)

TRACER = "tollgate"
SWITCHES = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
FAILED_OUTCOMES = ("failed", "unknown", "invalid", "denied")
# The key of the run's ids (runs.base.log_context) holding the OpenTelemetry context its work is under.
CONTEXT_KEY = "otel_context"
PSYCOPG_SCOPE = "opentelemetry.instrumentation.psycopg"


def configure_from_environment() -> bool:
    """Install the SDK's tracer provider with a batching exporter if the environment asks for traces (see the
    module doc); whether it did. Without the ``otel`` dependencies installed, logs a warning and does nothing."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true" or not any(os.environ.get(n) for n in SWITCHES):
        return False
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter_name == "none":
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        if exporter_name == "console":
            exporter = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()  # endpoint, headers, timeout: the OTEL_EXPORTER_OTLP_* variables
    except ImportError:
        log.warning("OTEL_* asks for traces but the OpenTelemetry SDK or exporter is not installed "
                    "(pip install 'tollgate[otel]'); no traces are sent")
        return False
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "tollgate"}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(WithoutLoneQueries(BatchSpanProcessor(exporter)))
    trace.set_tracer_provider(provider)
    instrument_libraries()
    return True


def instrument_libraries() -> list:
    """Turn on the official OpenTelemetry instrumentations of Django, psycopg, httpx and aiohttp's client (the
    ``otel`` extra; aiohttp's covers the sessions made after it is on) for the installed tracer provider; returns the instrumentors (already on ones are left as they are). Without
    the packages, logs a warning and returns ``[]``.

    Django's span middleware goes right after ``runs.ops.middleware.ProbeMiddleware`` (the probes and
    ``/metrics`` are not traced, and are not refused for their Host header on the way), unless
    ``OTEL_PYTHON_DJANGO_MIDDLEWARE_POSITION`` says otherwise. Query parameters and HTTP headers are not
    recorded (the instrumentations' defaults)."""
    try:
        from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
        from opentelemetry.instrumentation.django import DjangoInstrumentor
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    except ImportError:
        log.warning("traces are on but the OpenTelemetry instrumentations are not installed "
                    "(pip install 'tollgate[otel]'): Django, psycopg, httpx and aiohttp make no spans")
        return []
    probes = "runs.ops.middleware.ProbeMiddleware"
    if probes in settings.MIDDLEWARE:
        os.environ.setdefault("OTEL_PYTHON_DJANGO_MIDDLEWARE_POSITION", str(settings.MIDDLEWARE.index(probes) + 1))
    instrumentors = [DjangoInstrumentor(), PsycopgInstrumentor(), HTTPXClientInstrumentor(), AioHttpClientInstrumentor()]
    for instrumentor in instrumentors:
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument()
    return instrumentors


class WithoutLoneQueries:
    """An OpenTelemetry span processor that passes every ended span to ``processor`` (the exporting one) but
    a psycopg query span with no parent: a query outside any request, run or span (module doc)."""

    def __init__(self, processor):
        self._processor = processor

    def on_start(self, span, parent_context=None) -> None:
        self._processor.on_start(span, parent_context=parent_context)

    def on_end(self, span) -> None:
        if span.parent is None and span.instrumentation_scope is not None \
                and span.instrumentation_scope.name == PSYCOPG_SCOPE:
            return
        self._processor.on_end(span)

    def _on_ending(self, span) -> None:  # the SDK's hook before ``on_end`` (1.39 and later)
        on_ending = getattr(self._processor, "_on_ending", None)
        if on_ending is not None:
            on_ending(span)

    def shutdown(self) -> None:
        self._processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._processor.force_flush(timeout_millis)


def recording() -> bool:
    """Whether a tracer provider that records was installed (else nothing here makes a span)."""
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _tracer():
    return trace.get_tracer_provider().get_tracer(TRACER)


def _ns(moment) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def run_ids(run_id: int, created_at) -> tuple[int, int]:
    """``(trace id, root span id)`` of a run (``created_at``: its aware ``created_at``), the same in every process."""
    digest = hashlib.sha256(f"tollgate-run:{run_id}:{created_at.isoformat()}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def log_ids(run) -> dict:
    """What ``runs.base.log_context.note`` keeps of ``run`` for its slice: ``trace_id`` (the 32 hex digits of its
    trace id as viewers show it) and, under ``CONTEXT_KEY``, the run's context (``run_context``) that
    ``attached`` makes current; both None when no traces are recorded."""
    if not recording():
        return {"trace_id": None, CONTEXT_KEY: None}
    return {"trace_id": format(run_ids(run.pk, run.created_at)[0], "032x"), CONTEXT_KEY: run_context(run)}


def _under(span) -> None:
    """From now on the run's work (``attached``) is under ``span`` (None: not recording, nothing)."""
    if span is not None:
        log_context.note(**{CONTEXT_KEY: trace.set_span_in_context(span)})


def _back_to_root(span) -> None:
    """``span`` ends: the run's work is under the run's root (its parent) again."""
    if span is not None and span.parent is not None:
        log_context.note(**{CONTEXT_KEY: trace.set_span_in_context(NonRecordingSpan(span.parent))})


_NOTHING = contextlib.nullcontext()  # shared: it holds no state


def attached():
    """A context manager: within it, the OpenTelemetry context of the run this thread or task works for
    (``log_ids``) is the current one, so instrumented libraries put their spans in the run's trace; nothing
    outside a run or when not recording (then a ``contextlib.nullcontext``: the engine enters this around
    every stretch of a step and every call)."""
    known = log_context.value(CONTEXT_KEY)
    return _NOTHING if known is None else _attached(known)


@contextlib.contextmanager
def _attached(known):
    """``known`` (an OpenTelemetry context) is the current one within the block."""
    token = otel_context.attach(known)
    try:
        yield
    finally:
        otel_context.detach(token)


def in_run_trace(fn, *args):
    """``fn(*args)`` within ``attached()`` (for a thread the run's ids were handed to)."""
    with attached():
        return fn(*args)


def _content(value) -> str:
    """``value`` as JSON text for a span, credentials masked."""
    from runs.base.masking import mask_log_text

    return mask_log_text(json.dumps(value, default=str, ensure_ascii=False))


def run_context(run):
    """An OpenTelemetry context whose current span is the run's virtual root (``run_ids``)."""
    trace_id, span_id = run_ids(run.pk, run.created_at)
    root = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(root))


def _end(span, error: BaseException | None) -> None:
    if error is not None:
        span.set_attribute("error.type", type(error).__name__)
        span.set_status(Status(StatusCode.ERROR))
    span.end()


def start_model_span(run, model_config: dict, request=None):
    """The span of one model call of ``run`` with the agent's ``model_config`` (``{"provider", "model"?}``),
    started now; None when not recording. With ``TOLLGATE["TRACE_CONTENT"]`` on, the ``ModelRequest``'s
    instructions and messages are recorded too. End it with ``end_model_span``."""
    if not recording():
        return None
    model = str(model_config.get("model") or model_config.get("provider", ""))
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": str(model_config.get("provider", "")),
                  "gen_ai.request.model": model, "gen_ai.conversation.id": str(run.session_id),
                  "tollgate.run.id": run.pk}
    if request is not None and settings.TOLLGATE["TRACE_CONTENT"]:
        attributes["gen_ai.system_instructions"] = _content(request.instructions)
        attributes["gen_ai.input.messages"] = _content(request.messages)
    span = _tracer().start_span(f"chat {model}", context=run_context(run), kind=SpanKind.CLIENT,
                                attributes=attributes)
    _under(span)
    return span


def end_model_span(span, *, response=None, error: BaseException | None = None) -> None:
    """End a model call's span (None: nothing) with the ``ModelResponse``'s tokens and finish reason (and its
    text and tool calls with ``TOLLGATE["TRACE_CONTENT"]`` on), or the ``error``'s type."""
    if span is None:
        return
    _back_to_root(span)
    if response is not None:
        span.set_attribute("gen_ai.usage.input_tokens", response.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", response.output_tokens)
        span.set_attribute("gen_ai.response.finish_reasons", [response.finish_reason])
        if settings.TOLLGATE["TRACE_CONTENT"]:
            span.set_attribute("gen_ai.output.messages", _content(
                [{"role": "assistant", "content": response.content, "tool_calls": response.tool_calls}]))
    _end(span, error)


def start_tool_span(run, call):
    """The span of executing tool call ``call`` (a ``ToolCall``) of ``run``, started now; None when not
    recording. End it with ``end_tool_span``."""
    if not recording():
        return None
    span = _tracer().start_span(f"execute_tool {call.name}", context=run_context(run), kind=SpanKind.INTERNAL,
                                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
                                            "gen_ai.tool.call.id": call.provider_call_id,
                                            "tollgate.tool_call.id": call.pk,
                                            "tollgate.tool.side_effect": call.side_effect,
                                            "tollgate.run.id": run.pk})
    _under(span)
    return span


def end_tool_span(span, *, call=None, error: BaseException | None = None) -> None:
    """End a tool call's span (None: nothing) with the call's attempts and outcome (its status), or the
    ``error``'s type."""
    if span is None:
        return
    _back_to_root(span)
    if call is not None:
        span.set_attribute("tollgate.tool.attempts", call.attempts)
        span.set_attribute("tollgate.tool.outcome", call.status)
        if call.status in FAILED_OUTCOMES:
            span.set_status(Status(StatusCode.ERROR))
    _end(span, error)


def record_wait(run, reason: str, *, since, until, then: str) -> None:
    """Record a wait of ``run`` that is over: a ``<reason> wait`` span (``retry_backoff``, ``scheduled``,
    ``external_event``, ``input``, ``reconciliation``) from ``since`` to ``until`` (aware datetimes), with
    ``tollgate.wait.reason`` and ``tollgate.run.status`` (``then``: the status the run went on in, e.g.
    ``running``, ``queued``, ``failed``, ``cancelled``). Nothing when not recording."""
    if not recording():
        return
    span = _tracer().start_span(f"{reason} wait", context=run_context(run), start_time=_ns(since),
                                attributes={"tollgate.run.id": run.pk, "tollgate.wait.reason": reason,
                                            "tollgate.run.status": then})
    if then in ("failed", "cancelled"):
        span.set_status(Status(StatusCode.ERROR))
    span.end(end_time=_ns(until))


def record_decision(run, interrupt) -> None:
    """Record a decided approval item ``interrupt`` of ``run``: an ``approval wait`` span from its creation
    to its ``resolved_at`` and a ``decision`` span inside it. Nothing when not recording."""
    if not recording():
        return
    tracer = _tracer()
    wait = tracer.start_span("approval wait", context=run_context(run), start_time=_ns(interrupt.created_at),
                             attributes={"tollgate.run.id": run.pk, "tollgate.interrupt.id": interrupt.pk,
                                         "tollgate.interrupt.kind": interrupt.kind,
                                         "tollgate.tool_call.id": interrupt.tool_call_id or 0})
    decided = tracer.start_span("decision", context=trace.set_span_in_context(wait),
                                start_time=_ns(interrupt.resolved_at),
                                attributes={"tollgate.decision": interrupt.decision})
    decided.end(end_time=_ns(interrupt.resolved_at))
    wait.end(end_time=_ns(interrupt.resolved_at))
