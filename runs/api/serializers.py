"""REST representations of agents, runs, their events and tool calls.

Output serializers are read-only views of the models; input serializers
only check the shape of a request body; the services decide the rest.
"""

from django.conf import settings
from django.db.models import Prefetch
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from approvals.models import Interrupt, InterruptStatus
from approvals.api.serializers import CHANGES_FIELD
from config.api import OutputSerializer, StrictSerializer
from runs.engine.agents import BUDGET_LIMITS, MAX_TURNS_LIMIT
from runs.base.masking import mask_credentials
from runs.models import Agent, Message, MultitaskStrategy, Run, RunEvent, Session, Step
from runs.selectors import CONFLICT_CODES, FINAL_OUTPUT_CODES, PENDING_WAITS, final_output_status, pending_waits
from tools.models import ExternalEvent, ToolCall
from tools.waits import kind_of


class AgentSerializer(OutputSerializer):
    """One version of an agent definition; anything in its model config that looks like a credential is masked,
    for everyone.

    ``version`` counts from 1 per slug; ``is_current``: the version new runs use; ``archived_at``: when the
    agent was archived (null: it was not; set on the current version only). ``created_by`` made this version;
    ``loosened_tools``: the tools whose calls it asks approval for less often than the version before.
    """

    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = Agent
        fields = ["slug", "version", "is_current", "archived_at", "name", "instructions", "model", "tools",
                  "max_turns", "max_model_calls", "max_total_tokens", "max_cost_usd", "deadline_s",
                  "completion_check", "approval_policy", "loosened_tools", "created_by", "created_at"]
        read_only_fields = fields

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["model"] = mask_credentials(data["model"])
        return data


class AgentCreateSerializer(StrictSerializer):
    """Body of ``POST /api/agents/``; unknown fields are refused, ``runs.engine.agents.create_agent`` checks the rest."""

    slug = serializers.CharField(max_length=50)
    name = serializers.CharField(max_length=200)
    instructions = serializers.CharField(required=False, allow_blank=True, default="")
    model = serializers.JSONField(help_text='Provider config, e.g. {"provider": "scripted", "turns": [...]}.')
    tools = serializers.ListField(child=serializers.CharField(), required=False,
                                  help_text="Registered tool names the model may call; omitted or empty: none.")
    max_turns = serializers.IntegerField(required=False, min_value=1, max_value=MAX_TURNS_LIMIT)
    max_model_calls = serializers.IntegerField(required=False, allow_null=True, min_value=1,
                                               max_value=BUDGET_LIMITS["max_model_calls"])
    max_total_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1,
                                                max_value=BUDGET_LIMITS["max_total_tokens"])
    max_cost_usd = serializers.DecimalField(required=False, allow_null=True, max_digits=12, decimal_places=6,
                                            min_value=0, max_value=BUDGET_LIMITS["max_cost_usd"],
                                            help_text="US dollars; needs prices for the model.")
    deadline_s = serializers.IntegerField(required=False, allow_null=True, min_value=1,
                                          max_value=BUDGET_LIMITS["deadline_s"], help_text="Seconds.")
    completion_check = serializers.CharField(required=False)
    approval_policy = serializers.DictField(child=serializers.CharField(), required=False,
                                            help_text='Tool name to rule: "always", "never" or e.g. "amount > 50".')


class AgentUpdateSerializer(AgentCreateSerializer):
    """Body of ``PATCH /api/agents/{slug}/`` (use it with ``partial=True``): any field of the create body
    but the slug; unknown fields are refused, ``runs.engine.agents.update_agent`` checks the rest."""

    slug = None


class DecisionSerializer(OutputSerializer):
    """One decided inbox item of a run: decision, who and when, the comment and the changed arguments."""

    interrupt = serializers.IntegerField(source="pk", read_only=True)
    decided_by = serializers.SlugRelatedField(source="resolved_by", slug_field="username", read_only=True)
    decided_at = serializers.DateTimeField(source="resolved_at", read_only=True)
    changes = serializers.SerializerMethodField()

    class Meta:
        model = Interrupt
        fields = ["interrupt", "kind", "tool_call", "decision", "decided_by", "decided_at", "comment", "changes"]
        read_only_fields = fields

    @extend_schema_field(CHANGES_FIELD)
    def get_changes(self, interrupt: Interrupt) -> list[dict]:
        return interrupt.argument_changes()


def decided_items_prefetch() -> Prefetch:
    """Prefetch of a run's decided inbox items (as ``decided_items``) for ``RunSerializer.decisions``."""
    items = (Interrupt.objects.filter(status=InterruptStatus.RESOLVED).select_related("resolved_by", "tool_call")
             .order_by("resolved_at", "id"))
    return Prefetch("interrupts", queryset=items, to_attr="decided_items")


class FinalOutputConflictSerializer(serializers.Serializer):
    """One recorded fact that contradicts the model's final text (``runs.selectors.Conflict``)."""

    code = serializers.ChoiceField(choices=CONFLICT_CODES, help_text=(
        "outcome_not_achieved: the run's outcome; call_without_effect: a side-effecting call ended rejected, "
        "denied, failed, expired, cancelled or invalid, and no later call of the tool on the same target made up "
        "for it; call_outcome_unknown: a side-effecting call's effect is not known; arguments_edited: a call was "
        "executed with arguments a person edited when approving it."))
    status = serializers.CharField(help_text="The call's status; for outcome_not_achieved the run's outcome.")
    detail = serializers.CharField(allow_blank=True, help_text="The call's error, or the outcome's reason.")
    tool_call = serializers.IntegerField(allow_null=True, help_text="The call's id; null for the outcome.")
    tool = serializers.CharField(allow_blank=True, help_text="The call's tool; empty for the outcome.")
    changes = serializers.ListField(child=serializers.DictField(), help_text=(
        "For a call approved with edits: one entry per changed leaf (as a decision's `changes`); else empty."))


class FinalOutputStatusSerializer(serializers.Serializer):
    """How the recorded facts stand to the model's final text (``runs.selectors.final_output_status``)."""

    code = serializers.ChoiceField(choices=FINAL_OUTPUT_CODES, help_text=(
        "absent: no final text; not_contradicted: no recorded fact conflicts with it (the program never reads "
        "it, so this is not a confirmation); contradicted: the facts in `conflicts` do."))
    conflicts = FinalOutputConflictSerializer(many=True, help_text="Empty unless contradicted; the outcome first, "
                                                                   "then the calls in the order they were proposed.")


class RunSerializer(OutputSerializer):
    """A run: status fields, usage, timestamps; ``agent`` by slug (and ``agent_version``), requester by username.

    ``outcome`` and ``outcome_reason`` are the program's verdict (``runs.engine.completion``);
    ``final_output`` is the model's own last words, not a verdict: ``final_output_status`` says
    whether recorded facts contradict them (``contradicted``, with the ``conflicts``).
    ``decisions`` are the run's decided inbox items, oldest first: who
    decided what, when, their comment and what they changed.
    """

    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    agent_version = serializers.IntegerField(source="agent.version", read_only=True,
                                             help_text="The agent's version the run uses (fixed when it was made).")
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    decisions = serializers.SerializerMethodField()
    final_output_status = serializers.SerializerMethodField()
    waiting_for = serializers.SerializerMethodField(
        help_text="The pending wait of a waiting run (input, external_event, scheduled): kind, deadline, the "
                  "tool call; for a question the inbox item to answer (interrupt), for an event wait the "
                  "event_type and correlation_key to POST to /api/events/.")

    class Meta:
        model = Run
        fields = ["id", "status", "phase", "waiting_reason", "waiting_for", "failure_type", "outcome",
                  "outcome_reason", "session", "agent", "agent_version",
                  "requested_by", "input", "final_output", "final_output_status", "error", "wake_at", "cancel_requested_at", "retry_of",
                  "model_calls", "input_tokens", "output_tokens", "created_at", "updated_at", "started_at",
                  "finished_at", "decisions"]
        read_only_fields = fields

    @extend_schema_field(DecisionSerializer(many=True))
    def get_decisions(self, run: Run) -> list[dict]:
        """From ``decided_items`` when the queryset prefetched them (``decided_items_prefetch``), else one query."""
        items = getattr(run, "decided_items", None)
        if items is None:
            items = decided_items_prefetch().queryset.filter(run=run)
        return DecisionSerializer(items, many=True).data

    @extend_schema_field(FinalOutputStatusSerializer)
    def get_final_output_status(self, run: Run) -> dict:
        """``final_output_status(run)``: its facts prefetched (``runs.selectors.with_final_output_facts``), else read."""
        return final_output_status(run).as_dict()

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_waiting_for(self, run: Run) -> dict | None:
        """The first pending wait: prefetched (``runs.selectors.with_pending_waits``), else read with one query."""
        if run.status != "waiting":
            return None
        waits = getattr(run, PENDING_WAITS, None)
        if waits is None:
            waits = pending_waits().filter(run=run)[:1]
        wait = next(iter(waits), None)
        if wait is None:
            return None
        found = {"kind": wait.kind, "deadline": wait.deadline.isoformat(), "tool_call": wait.tool_call_id}
        if wait.event_type:
            found.update(event_type=wait.event_type, correlation_key=wait.correlation_key)
        if kind_of(wait).inbox_item:  # the inbox item to answer
            found["interrupt"] = wait.interrupt_id
        return found


class OffsetDateTimeField(serializers.DateTimeField):
    """An ISO 8601 date and time that must carry its UTC offset (``Z`` or ``+08:00``): without one it is a 400.

    DRF's ``DateTimeField`` reads a time without an offset in the server's
    zone, so ``2026-12-01T09:00`` would silently mean 09:00 UTC to a client
    who meant its own 09:00.
    """

    default_error_messages = {**serializers.DateTimeField.default_error_messages,
                              "naive": "Give a date and time with a UTC offset (e.g. Z or +08:00)."}

    def to_internal_value(self, value):
        parsed = super().to_internal_value(value)  # a malformed value fails here
        if isinstance(value, str) and timezone.is_naive(parse_datetime(value.strip()) or parsed):
            self.fail("naive")
        return parsed


class RunCreateSerializer(StrictSerializer):
    """Body of ``POST /api/runs/``: the agent's slug, the input, optionally a session to continue."""

    agent = serializers.SlugRelatedField(slug_field="slug", queryset=Agent.objects.current(),
                                         help_text="The agent's slug; the run uses its current version.")
    input = serializers.CharField(help_text="The user's request; limited to TOLLGATE['MAX_INPUT_CHARS'] characters.")
    session = serializers.PrimaryKeyRelatedField(queryset=Session.objects.none(), required=False, allow_null=True,
                                                 help_text="One of your sessions, to continue it; omitted: a new one.")
    multitask_strategy = serializers.ChoiceField(
        choices=MultitaskStrategy.values, default=MultitaskStrategy.ENQUEUE,
        help_text="If the session has an active run: enqueue (default), supplement, interrupt or reject (409).")
    start_at = OffsetDateTimeField(
        required=False, allow_null=True, default=None,
        help_text="ISO 8601 with offset: the run stays queued (waiting_reason scheduled) until then; at most "
                  "TOLLGATE['MAX_WAIT_S'] ahead. A past time starts it at once.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.fields["session"].queryset = Session.objects.filter(owner=request.user).select_related("agent")


class RunBatchCreateSerializer(StrictSerializer):
    """Body of ``POST /api/runs/batch/``: the agent's slug and the inputs, one new run (in a new session) each."""

    agent = serializers.SlugRelatedField(slug_field="slug", queryset=Agent.objects.current(),
                                         help_text="The agent's slug; the runs use its current version.")
    inputs = serializers.ListField(
        child=serializers.CharField(), allow_empty=False,
        help_text="One request per run, in order; at most TOLLGATE['RUN_BATCH_MAX'] of them (and no more than "
                  "the runs throttle rate), each limited to TOLLGATE['MAX_INPUT_CHARS'] characters.")
    start_at = OffsetDateTimeField(
        required=False, allow_null=True, default=None,
        help_text="ISO 8601 with offset: every run stays queued (waiting_reason scheduled) until then; at most "
                  "TOLLGATE['MAX_WAIT_S'] ahead. A past time starts them at once.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        limits = settings.TOLLGATE
        self.fields["inputs"] = serializers.ListField(
            child=serializers.CharField(max_length=limits["MAX_INPUT_CHARS"]), allow_empty=False,
            max_length=limits["RUN_BATCH_MAX"], help_text=self.fields["inputs"].help_text)


class SessionSerializer(OutputSerializer):
    """A session (a conversation thread): its agent by slug, its owner by username, title and metadata."""

    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Session
        fields = ["id", "agent", "owner", "title", "metadata", "created_at"]
        read_only_fields = fields


class SessionCreateSerializer(StrictSerializer):
    """Body of ``POST /api/sessions/``: the agent's slug, an optional title and metadata object."""

    agent = serializers.SlugRelatedField(slug_field="slug", queryset=Agent.objects.current(),
                                         help_text="The agent's slug; the session starts with its current version.")
    title = serializers.CharField(required=False, allow_blank=True, default="",
                                  max_length=Session._meta.get_field("title").max_length)
    metadata = serializers.DictField(required=False, default=dict, help_text=(
        "Your own JSON object (e.g. a ticket id), at most TOLLGATE['MAX_SESSION_METADATA_BYTES'] "
        "bytes as JSON; Tollgate never reads it."))


class MessageSerializer(OutputSerializer):
    """One entry of a session's history: ``role`` (user, assistant, tool, system), the text, the
    tool calls an assistant message proposed, the call a tool message answers, and the ``run`` it belongs to."""

    class Meta:
        model = Message
        fields = ["id", "run", "role", "content", "tool_calls", "tool_call_id", "created_at"]
        read_only_fields = fields


class CancelSerializer(StrictSerializer):
    """Body of ``POST /api/runs/{id}/cancel/`` (and ``retry/``): nothing (any field is refused)."""


class EventSerializer(StrictSerializer):
    """Body of ``POST /api/events/``: the event's type, the correlation key a run waits on, a JSON payload."""

    type = serializers.CharField(max_length=100, help_text="The event_type the run's wait_for_event named.")
    key = serializers.CharField(max_length=200, help_text="The correlation key (the run shows it in waiting_for).")
    payload = serializers.JSONField(required=False, default=dict,
                                    help_text="Given to the model as the tool result; limited to "
                                              "TOLLGATE['MAX_EVENT_PAYLOAD_BYTES'] bytes of JSON.")


class ExternalEventSerializer(serializers.ModelSerializer):
    """A stored external event; ``duplicate`` is True when this POST repeated an earlier delivery."""

    duplicate = serializers.SerializerMethodField()

    class Meta:
        model = ExternalEvent
        fields = ["id", "type", "key", "run", "received_at", "duplicate"]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField())
    def get_duplicate(self, event) -> bool:
        return bool(self.context.get("duplicate"))


class RunEventSerializer(OutputSerializer):
    """One entry of a run's append-only event log."""

    class Meta:
        model = RunEvent
        fields = ["seq", "type", "from_status", "to_status", "actor", "reason", "payload", "created_at"]
        read_only_fields = fields


class ServerErrorSerializer(serializers.Serializer):
    """The model server's error answer to one call (docs/design.md#model-errors)."""

    status = serializers.IntegerField(help_text="The HTTP status it answered with.")
    message = serializers.CharField(allow_blank=True, help_text=(
        "The message of its error body, at most 300 characters, credentials masked; empty if it gave none."))


class StepSerializer(OutputSerializer):
    """One model call of a run: its status, when it started and ended, its usage and how it ended.

    ``finish_reason``: ``stop``, ``tool_calls`` or ``length`` for an answer,
    null otherwise. ``error``: why a call failed or was discarded, the model
    server's words included; ``server_error``: the server's error answer
    (status and message) when it sent one, else null.
    """

    finish_reason = serializers.SerializerMethodField()
    server_error = serializers.SerializerMethodField()

    class Meta:
        model = Step
        fields = ["id", "index", "status", "started_at", "finished_at", "input_tokens", "output_tokens", "cost_usd",
                  "finish_reason", "error", "server_error"]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=["stop", "tool_calls", "length"], allow_null=True))
    def get_finish_reason(self, step: Step) -> str | None:
        """The answer's normalised finish reason (``runs.base.model_call.ModelResponse``), null for no answer."""
        return step.response.get("finish_reason") if step.status == Step.Status.SUCCEEDED else None

    @extend_schema_field(ServerErrorSerializer(allow_null=True))
    def get_server_error(self, step: Step) -> dict | None:
        """``{"status", "message"}`` from ``response["error"]`` (``Step.fail``), null when no server answered."""
        error = step.response.get("error") or {}
        if "status" not in error:
            return None
        return {"status": error["status"], "message": error.get("message", "")}


class ToolCallSerializer(OutputSerializer):
    """One tool call of a run: raw and parsed arguments, status, result or error.

    ``duplicate_of``: the id of the earlier call whose action this one repeats (it ends as that one ended).
    """

    class Meta:
        model = ToolCall
        fields = ["id", "name", "status", "raw_arguments", "arguments", "result", "error", "idempotency_key",
                  "attempts", "side_effect", "duplicate_of", "provider_call_id", "created_at", "started_at",
                  "finished_at"]
        read_only_fields = fields
