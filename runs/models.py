"""Sessions, runs, steps, messages and the run event log.

Every legal change of ``Run.status`` and ``Step.status`` is a django-fsm
transition below, with its guards next to it (docs/design.md#run-status,
docs/design.md#step-status). The transition methods only change the fields of the
instance; ``runs.transitions.apply`` saves them and appends the ``RunEvent``
in the same database transaction.
"""

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone
from django_fsm import FSMField, transition

from runs.access import RunQuerySet
from runs.fsm import FSMModel


class Agent(models.Model):
    """An agent definition: instructions, model provider, tools and budgets.

    ``model`` is the provider config, e.g. ``{"provider": "scripted",
    "turns": [...]}`` (see ``runs.providers``). ``tools`` lists registered
    tool names (empty list: every registered tool). ``approval_policy``
    maps a tool name to an approval rule (``tools.policy``), which adds
    to the tool's own rule: approval is needed when either asks. Only when
    ``approval_policy_granted_by`` is set (a holder of
    ``runs.loosen_approval_policy`` saved the policy) does the agent's rule
    replace the tool's, which may loosen it; runs log each such use.
    ``completion_check`` names a check in ``runs.engine.completion``.
    """

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    instructions = models.TextField(blank=True)
    model = models.JSONField(default=dict)
    tools = models.JSONField(default=list, blank=True)
    approval_policy = models.JSONField(default=dict, blank=True)
    approval_policy_granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, editable=False, on_delete=models.PROTECT,
        related_name="+", help_text="Who allowed this policy to replace (and so loosen) the tools' own rules.")
    completion_check = models.CharField(max_length=100, default="default")
    max_turns = models.PositiveIntegerField(default=20)
    # Budgets checked before every model call (runs.engine.budgets); null: no limit.
    max_model_calls = models.PositiveIntegerField(
        null=True, blank=True, help_text="Model calls per run, counting failed and discarded ones; empty: TOLLGATE['DEFAULT_MAX_MODEL_CALLS'].")
    max_total_tokens = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Input plus output tokens per run.")
    max_cost_usd = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True,
        help_text="US dollars per run, priced by TOLLGATE['MODEL_PRICES'].")
    deadline_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds of wall-clock time from the run's start.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        permissions = [("loosen_approval_policy", "Can let an agent's approval rules replace the tools' own")]

    def __str__(self):
        return self.slug


class Session(models.Model):
    """A long-lived conversation thread; it outlives each of its runs."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="agent_sessions")
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="sessions")
    title = models.CharField(max_length=200, blank=True)
    metadata = models.JSONField(
        default=dict, blank=True, help_text="The client's own JSON object (e.g. a ticket id); never read by the runtime.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [  # the list's order, alone and per owner (who sees what) and agent (a filter)
            models.Index(fields=["created_at", "id"], name="session_created"),
            models.Index(fields=["owner", "created_at", "id"], name="session_owner_created"),
            models.Index(fields=["agent", "created_at", "id"], name="session_agent_created"),
        ]

    def __str__(self):
        return f"session {self.pk} ({self.agent.slug})"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING]
# A session has at most one run in these (queued runs wait their turn).
BUSY_STATUSES = [RunStatus.RUNNING, RunStatus.WAITING]
TERMINAL_STATUSES = [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED]


class Phase(models.TextChoices):
    TRIAGING = "triaging"
    PREPARING_CONTEXT = "preparing_context"
    CALLING_MODEL = "calling_model"
    EXECUTING_TOOLS = "executing_tools"
    FINALIZING = "finalizing"


class WaitingReason(models.TextChoices):
    APPROVAL = "approval"
    INPUT = "input"
    RECONCILIATION = "reconciliation"
    RETRY_BACKOFF = "retry_backoff"
    SCHEDULED = "scheduled"
    EXTERNAL_EVENT = "external_event"


class FailureType(models.TextChoices):
    MODEL_ERROR = "model_error"
    INVALID_MODEL_OUTPUT = "invalid_model_output"
    TOOL_ERROR = "tool_error"
    PERMISSION_DENIED = "permission_denied"
    BUDGET_EXHAUSTED = "budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    APPROVAL_EXPIRED = "approval_expired"
    INCOMPLETE = "incomplete"
    INTERNAL_ERROR = "internal_error"
    CRASH_LOOP = "crash_loop"


class MultitaskStrategy(models.TextChoices):
    """What a new input does when its session already has an active run (docs/design.md#multitask)."""

    ENQUEUE = "enqueue"  # a new run, started when the session is free
    SUPPLEMENT = "supplement"  # added to the busy run's conversation, read before its next model call
    INTERRUPT = "interrupt"  # cancel the active runs, then a new run
    REJECT = "reject"  # 409


class Outcome(models.TextChoices):
    ACHIEVED = "achieved"
    NOT_ACHIEVED = "not_achieved"


def _no_cancel_requested(run: "Run") -> bool:
    """Guard: nobody asked to cancel the run (a cancel beats starting, waiting and completing)."""
    return run.cancel_requested_at is None


def _waits_for_a_person(run: "Run") -> bool:
    """Guard: the run waits for an inbox decision, settlement or answer, or an outside event (not a timer alone)."""
    return run.waiting_reason in (WaitingReason.APPROVAL, WaitingReason.RECONCILIATION, WaitingReason.INPUT,
                                  WaitingReason.EXTERNAL_EVENT)


def _has_a_timer(run: "Run") -> bool:
    """Guard: the run waits until a ``wake_at`` (whether it has passed is the sweeper's clock to say)."""
    return run.wake_at is not None


class Run(FSMModel):
    """One task of a session, from the user's input to a terminal status.

    ``status`` is protected: only the transition methods change it, and
    ``runs.transitions.apply`` is the only caller. ``model_calls`` counts model steps
    that were not discarded; the scripted provider also uses it as the index
    of the next turn. ``repair_turns`` and ``incomplete_nudges`` count the
    turns spent on invalid output and on "not complete yet" feedback.
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runs")
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="runs")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="requested_runs")
    input = models.TextField()
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries")

    status = FSMField(default=RunStatus.QUEUED, choices=RunStatus.choices, protected=True, db_index=True)
    phase = models.CharField(max_length=32, choices=Phase.choices, blank=True)
    waiting_reason = models.CharField(max_length=32, choices=WaitingReason.choices, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    failure_type = models.CharField(max_length=32, choices=FailureType.choices, blank=True)
    outcome = models.CharField(max_length=32, choices=Outcome.choices, blank=True)
    outcome_reason = models.TextField(
        blank=True, help_text="Why the completion check decided the outcome (runs.engine.completion), e.g. the call that failed.")
    error = models.TextField(blank=True)
    final_output = models.TextField(blank=True)

    model_calls = models.PositiveIntegerField(default=0)
    repair_turns = models.PositiveIntegerField(default=0)
    incomplete_nudges = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    last_event_seq = models.PositiveIntegerField(default=0)
    lost_leases = models.PositiveIntegerField(
        default=0, help_text="Times a worker died holding this run with a step or tool call in flight.")
    crash_streak = models.PositiveIntegerField(
        default=0, help_text="Such deaths since the run last made progress; TOLLGATE['MAX_CRASHES_PER_STEP'] ends it.")
    loss_streak = models.PositiveIntegerField(
        default=0, help_text="Deaths with work in flight since the last progress, blamed on this run or not; "
                             "TOLLGATE['MAX_LOSSES_PER_STEP'] ends it.")
    death_blame = models.CharField(
        max_length=16, blank=True,
        help_text="How the sweeper counted the run's last death: culprit or bystander (empty: not counted yet).")

    lease_owner = models.CharField(max_length=200, blank=True)
    lease_token = models.PositiveBigIntegerField(default=0, help_text="Fencing token; grows with every acquisition.")
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)

    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()  # visible_to / cancellable_by (runs.access)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["session"],
                condition=models.Q(status__in=BUSY_STATUSES),
                name="one_busy_run_per_session",
            ),
            models.UniqueConstraint(
                fields=["requested_by", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="run_idempotency_key_per_user",
            ),
        ]
        # Lists read newest first, (created_at, id) descending, narrowed by
        # who may see them and by the common filters; the sweeper reads the
        # few rows with a timer, and waiting runs by agent and start for
        # deadlines. Each one is an index scan that stops after a page or
        # at the first row not yet due, however many runs wait
        # (docs/design.md#scale-of-the-waiting-set). None covers updated_at:
        # every save changes it, and an index on it would cost every update.
        indexes = [
            models.Index(fields=["created_at", "id"], name="run_created"),
            models.Index(fields=["requested_by", "created_at", "id"], name="run_requester_created"),
            models.Index(fields=["status", "created_at", "id"], name="run_status_created"),
            models.Index(fields=["agent", "created_at", "id"], name="run_agent_created"),
            models.Index(fields=["waiting_reason", "created_at", "id"], name="run_reason_created",
                         condition=~models.Q(waiting_reason="")),
            models.Index(fields=["wake_at"], name="run_wake_at_set", condition=models.Q(wake_at__isnull=False)),
            models.Index(fields=["agent", "started_at"], name="run_waiting_started",
                         condition=models.Q(status="waiting")),
        ]

    def __str__(self):
        return f"run {self.pk} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def event_run(self) -> "Run":
        return self

    def event_payload(self, arguments: dict) -> dict:
        """The transition's plain arguments (e.g. ``failure_type``), and the waiting reason while waiting."""
        payload = {key: value for key, value in arguments.items()
                   if isinstance(value, (str, int, float, bool, type(None)))}
        if self.waiting_reason:
            payload["waiting_reason"] = self.waiting_reason
        return payload

    # --- transitions (docs/design.md#run-status) -------------------------

    @transition(field=status, source=RunStatus.QUEUED, target=RunStatus.RUNNING, conditions=[_no_cancel_requested])
    def start(self):
        self.phase = Phase.PREPARING_CONTEXT
        self.started_at = timezone.now()
        self.waiting_reason = ""  # a run created with start_at waited "scheduled" while queued
        self.wake_at = None

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.WAITING, conditions=[_no_cancel_requested])
    def wait(self, waiting_reason: str, wake_at=None):
        self.waiting_reason = waiting_reason
        self.wake_at = wake_at
        self.phase = ""

    def _run_again(self):
        self.waiting_reason = ""
        self.wake_at = None
        self.phase = Phase.PREPARING_CONTEXT

    @transition(field=status, source=RunStatus.WAITING, target=RunStatus.RUNNING, conditions=[_waits_for_a_person])
    def resume(self):
        """A decision or settlement unblocked the run (the caller checks that no item is still pending)."""
        self._run_again()

    @transition(field=status, source=RunStatus.WAITING, target=RunStatus.RUNNING, conditions=[_has_a_timer])
    def wake(self):
        """The run's ``wake_at`` has passed (the sweeper, by its clock)."""
        self._run_again()

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.COMPLETED,
                conditions=[_no_cancel_requested])
    def complete(self, outcome: str, final_output: str, outcome_reason: str = ""):
        self.outcome = outcome
        self.outcome_reason = outcome_reason
        self.final_output = final_output
        self._finish()

    @transition(field=status, source=ACTIVE_STATUSES, target=RunStatus.FAILED)
    def fail(self, failure_type: str, error: str):
        self.failure_type = failure_type
        self.error = error
        self._finish()

    @transition(field=status, source=ACTIVE_STATUSES, target=RunStatus.CANCELLED)
    def cancel(self):
        self._finish()

    def _finish(self):
        self.phase = ""
        self.waiting_reason = ""
        self.wake_at = None
        self.finished_at = timezone.now()


class Step(FSMModel):
    """One model call of a run: what was asked, what came back, the usage.

    ``status`` (docs/design.md#step-status): ``started`` while the call is in
    flight, then ``succeeded`` (the answer is recorded) or ``failed`` (an
    error, or a response that could not be understood); ``discarded`` marks
    a half-received response, or a call whose worker died, thrown away. It
    is protected: only the transitions below change it, through
    ``runs.transitions.apply``, which logs each as a ``model_call`` event.
    """

    class Status(models.TextChoices):
        STARTED = "started"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        DISCARDED = "discarded"

    event_type = "model_call"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveIntegerField()
    status = FSMField(max_length=16, choices=Status.choices, default=Status.STARTED, protected=True)
    request = models.JSONField(default=dict)
    response = models.JSONField(default=dict)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="step_index_per_run")]

    def __str__(self):
        return f"step {self.index} of run {self.run_id}"

    def event_run(self) -> Run:
        return self.run

    def event_payload(self, arguments: dict) -> dict:
        return {"step": self.pk}

    # --- transitions (docs/design.md#step-status) ------------------------

    @transition(field=status, source=Status.STARTED, target=Status.SUCCEEDED)
    def succeed(self, *, response: dict, input_tokens: int, output_tokens: int, cost_usd, now):
        """The model's answer is recorded, with its usage (tokens, US dollars)."""
        self.response = response
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cost_usd = cost_usd
        self.finished_at = now

    @transition(field=status, source=Status.STARTED, target=Status.FAILED)
    def fail(self, *, error: str, now):
        """The call failed (a provider error) or its response could not be understood."""
        self.error = error
        self.finished_at = now

    @transition(field=status, source=Status.STARTED, target=Status.DISCARDED)
    def discard(self, *, now, error: str = ""):
        """Half an answer arrived, or the worker making the call died: asked again, still counted."""
        self.error = error
        self.finished_at = now


class Message(models.Model):
    """One entry of a session's conversation, in provider-neutral form.

    Append-only: context building may trim or summarise what it sends to the
    model, never these rows. ``role`` is ``user``, ``assistant``, ``tool``
    or ``system`` (runtime feedback such as "not complete yet").
    ``tool_calls`` (assistant) is ``[{"id", "name", "arguments"}]`` with
    ``arguments`` as the raw string the model produced; ``tool_call_id``
    (tool) names the call it answers.
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="messages")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16)
    content = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"{self.role} message {self.pk}"


class RunEvent(models.Model):
    """Append-only audit log of a run; ``seq`` grows by one per run.

    ``type`` is e.g. ``transition``, ``model_call``, ``tool_call``,
    ``interrupt``, ``error``. For transitions ``from_status``/``to_status``
    are set. ``actor`` is ``system``, ``worker`` or ``user:<username>``.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=32)
    from_status = models.CharField(max_length=32, blank=True)
    to_status = models.CharField(max_length=32, blank=True)
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="event_seq_per_run")]

    def __str__(self):
        return f"event {self.seq} of run {self.run_id}: {self.type}"


class WaitStatus(models.TextChoices):
    PENDING = "pending"  # the run waits for it
    DONE = "done"  # answered, received, or the time came: ``result`` is the tool call's result
    TIMED_OUT = "timed_out"  # nothing came by ``deadline``: the tool call fails with ``error``
    REFUSED = "refused"  # could not be opened (e.g. the event key is taken): the tool call fails with ``error``
    CANCELLED = "cancelled"  # the run ended first


class Wait(models.Model):
    """What a run waits for on behalf of one tool call of a built-in waiting tool (``tools.builtin``).

    ``kind`` is the run's waiting reason while it waits: ``input`` (a
    person's answer to an inbox item of kind ``input``), ``external_event``
    (a ``POST /api/events/`` with ``event_type`` and ``correlation_key``)
    or ``scheduled`` (the time ``deadline``). ``deadline`` is also the run's
    ``wake_at``: the sweeper ends the wait then (docs/design.md#waits).
    ``status`` is a plain field written with conditional updates under the
    run's row lock (``runs.waits``); no FSM. While pending, an event
    type + key pair belongs to one wait only.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="waits")
    tool_call = models.OneToOneField("tools.ToolCall", on_delete=models.CASCADE, related_name="wait")
    kind = models.CharField(max_length=32, choices=WaitingReason.choices)
    status = models.CharField(max_length=16, choices=WaitStatus.choices, default=WaitStatus.PENDING, db_index=True)
    event_type = models.CharField(max_length=100, blank=True)
    correlation_key = models.CharField(max_length=200, blank=True)
    deadline = models.DateTimeField(help_text="When the wait ends: the time itself (scheduled), else its timeout.")
    result = models.JSONField(null=True, blank=True, help_text="The tool call's result once done.")
    error = models.TextField(blank=True, help_text="Why the tool call fails (timed out, refused).")
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["event_type", "correlation_key"],
                condition=models.Q(status="pending", kind="external_event"),
                name="one_pending_wait_per_event_key",
            ),
        ]

    def __str__(self):
        return f"{self.kind} wait {self.pk} of run {self.run_id} ({self.status})"


class ExternalEvent(models.Model):
    """An event an outside system delivered to a waiting run (``POST /api/events/``).

    ``(type, key)`` is unique: the first delivery is stored and resumes the
    run; a repeat changes nothing. ``payload`` became the waiting tool
    call's result.
    """

    type = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="external_events")
    wait = models.OneToOneField(Wait, on_delete=models.CASCADE, related_name="event")
    received_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["type", "key"], name="external_event_type_key")]

    def __str__(self):
        return f"event {self.type} ({self.pk}) for run {self.run_id}"


class IdempotentRequest(models.Model):
    """A mutating API request sent with an ``Idempotency-Key``, and the answer to replay for it.

    Unique per ``(user, scope, key)``: ``scope`` is the endpoint (its URL
    name), so one key may be used once per endpoint by each user. The
    insert of this row decides which of two concurrent requests runs
    (``config.idempotency``). ``fingerprint`` is the sha256 (hex) of the
    method, path and canonical JSON body. ``response_status`` and
    ``response_body`` are empty while the request is being handled;
    ``expires_at`` ends the key's life (24 hours after first use).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    scope = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    started_at = models.DateTimeField(help_text="When the request holding the key began (a stale one is taken over).")
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "scope", "key"], name="idempotent_request_per_user_scope")]

    def __str__(self):
        return f"{self.scope} {self.key!r} of user {self.user_id}"
