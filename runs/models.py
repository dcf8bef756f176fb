"""Sessions, runs, steps, messages and the run event log.

Every legal change of ``Run.status`` and ``Step.status`` is a django-fsm
transition below, with its guards next to it (docs/design.md#run-status,
docs/design.md#step-status). The transition methods only change the fields of the
instance; ``runs.transitions.apply`` saves them and appends the ``RunEvent``
in the same database transaction.
"""

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django_fsm import FSMField, transition

from config.strict_json import StoredJSONDecoder
from runs.base import tracing
from runs.access import RunQuerySet
from runs.base.fsm import FSMModel
from runs.base.labels import choice, label


class AgentQuerySet(models.QuerySet):
    """Agent versions: ``current()`` is one row per slug, ``listed()`` those not archived."""

    def current(self) -> "AgentQuerySet":
        """The current version of every agent, archived ones included (what a slug names)."""
        return self.filter(is_current=True)

    def listed(self) -> "AgentQuerySet":
        """The current version of every agent that is not archived: what new runs and sessions can use."""
        return self.current().filter(archived_at__isnull=True)


class Agent(models.Model):
    """One version of an agent definition: instructions, model provider, tools and budgets.

    ``model`` is the provider config, e.g. ``{"provider": "scripted",
    "turns": [...]}`` (see ``runs.providers``). ``tools`` lists registered
    tool names (empty list: no tools). ``approval_policy``
    maps a tool name to an approval rule (``tools.policy``), which adds
    to the tool's own rule: approval is needed when either asks. Only when
    ``approval_policy_granted_by`` is set (a holder of
    ``runs.loosen_approval_policy`` saved the policy) does the agent's rule
    replace the tool's, which may loosen it; runs log each such use.
    ``completion_check`` names a check in ``runs.engine.completion``.

    Versions (docs/design.md#agent-versions): a row is never edited; a
    change is a new row of the same ``slug`` with the next ``version``
    (``runs.engine.agents.update_agent``), which becomes the one
    ``is_current`` row of the slug. Runs and sessions point at the row they
    started with, so a run keeps its version. ``archived_at`` is set on the
    current row when the agent is archived (no new runs or sessions).
    ``created_by`` made the version; ``loosened_tools`` names the tools whose
    approval it loosened compared to the version before (or to the tools'
    own rules, for version 1).
    """

    slug = models.SlugField(_("slug"))
    version = models.PositiveIntegerField(_("version"), default=1, editable=False)
    is_current = models.BooleanField(_("current"), default=True, editable=False,
                                     help_text=_("The version new runs and sessions of this slug use."))
    archived_at = models.DateTimeField(
        _("archived at"), null=True, blank=True, editable=False,
        help_text=_("Set on the current version when the agent was archived: it takes no new runs or sessions."))
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, verbose_name=_("created by"), null=True, blank=True, editable=False,
        on_delete=models.PROTECT, related_name="+")
    loosened_tools = models.JSONField(
        _("loosened tools"), default=list, blank=True, editable=False, decoder=StoredJSONDecoder,
        help_text=_("Tools whose calls this version asks approval for less often than the version before."))
    name = models.CharField(_("name"), max_length=200)
    instructions = models.TextField(_("instructions"), blank=True)
    model = models.JSONField(_("model"), default=dict, decoder=StoredJSONDecoder)
    tools = models.JSONField(_("tools"), default=list, blank=True, decoder=StoredJSONDecoder)
    approval_policy = models.JSONField(_("approval policy"), default=dict, blank=True, decoder=StoredJSONDecoder)
    approval_policy_granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, verbose_name=_("approval policy granted by"), null=True, blank=True, editable=False,
        on_delete=models.PROTECT, related_name="+",
        help_text=_("Who allowed this policy to replace (and so loosen) the tools' own rules."))
    completion_check = models.CharField(_("completion check"), max_length=100, default="default")
    max_turns = models.PositiveIntegerField(_("max turns"), default=20)
    # Budgets checked before every model call (runs.engine.budgets); null: no limit.
    max_model_calls = models.PositiveIntegerField(
        _("max model calls"), null=True, blank=True,
        help_text=_("Model calls per run, counting failed and discarded ones; "
                    "empty: TOLLGATE['DEFAULT_MAX_MODEL_CALLS']."))
    max_total_tokens = models.PositiveBigIntegerField(
        _("max total tokens"), null=True, blank=True, help_text=_("Input plus output tokens per run."))
    max_cost_usd = models.DecimalField(
        _("max cost (USD)"), max_digits=12, decimal_places=6, null=True, blank=True,
        help_text=_("US dollars per run, priced by TOLLGATE['MODEL_PRICES']."))
    deadline_s = models.PositiveIntegerField(
        _("deadline (seconds)"), null=True, blank=True, help_text=_("Seconds of wall-clock time from the run's start."))
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    objects = AgentQuerySet.as_manager()

    class Meta:
        verbose_name = _("agent")
        verbose_name_plural = _("agents")
        ordering = ["slug", "version"]
        permissions = [("loosen_approval_policy", "Can let an agent's approval rules replace the tools' own")]
        constraints = [
            models.UniqueConstraint(fields=["slug", "version"], name="agent_slug_version"),
            models.UniqueConstraint(fields=["slug"], condition=models.Q(is_current=True),
                                    name="agent_one_current_version",
                                    violation_error_message=_("An agent with this slug already exists.")),
        ]

    def __str__(self):
        return f"{self.slug} v{self.version}"


class Session(models.Model):
    """A long-lived conversation thread; it outlives each of its runs."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("owner"), on_delete=models.CASCADE,
                              related_name="agent_sessions")
    agent = models.ForeignKey(Agent, verbose_name=_("agent"), on_delete=models.PROTECT, related_name="sessions")
    title = models.CharField(_("title"), max_length=200, blank=True)
    metadata = models.JSONField(
        _("metadata"), default=dict, blank=True,
        help_text=_("The client's own JSON object (e.g. a ticket id); never read by the runtime."),
        decoder=StoredJSONDecoder)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("session")
        verbose_name_plural = _("sessions")
        ordering = ["-created_at"]
        indexes = [  # the list's order, alone and per owner (who sees what) and agent (a filter)
            models.Index(fields=["created_at", "id"], name="session_created"),
            models.Index(fields=["owner", "created_at", "id"], name="session_owner_created"),
            models.Index(fields=["agent", "created_at", "id"], name="session_agent_created"),
        ]

    def __str__(self):
        return f"session {self.pk} ({self.agent.slug})"

    def get_absolute_url(self) -> str:
        """The page of the session's newest run (it shows the whole conversation), or the run list before any run."""
        newest = self.runs.order_by("-created_at", "-pk").values_list("pk", flat=True).first()
        return reverse("run-list") if newest is None else reverse("run-detail", args=[newest])


class RunStatus(models.TextChoices):
    QUEUED = choice("queued")
    RUNNING = choice("running")
    WAITING = choice("waiting")
    COMPLETED = choice("completed")
    FAILED = choice("failed")
    CANCELLED = choice("cancelled")


ACTIVE_STATUSES = [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING]
# A session has at most one run in these (queued runs wait their turn).
BUSY_STATUSES = [RunStatus.RUNNING, RunStatus.WAITING]
TERMINAL_STATUSES = [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED]


class Phase(models.TextChoices):
    PREPARING_CONTEXT = choice("preparing_context")
    CALLING_MODEL = choice("calling_model")
    EXECUTING_TOOLS = choice("executing_tools")
    FINALIZING = choice("finalizing")


class WaitingReason(models.TextChoices):
    """The reasons the product ships with; ``Run.waiting_reason`` (no ``choices``: ``is_waiting_reason``) also takes kinds
    registered later. ``input``, ``scheduled``, ``external_event`` are kinds of waits (docs/design.md#waits).
    """

    APPROVAL = choice("approval")
    INPUT = choice("input")
    RECONCILIATION = choice("reconciliation")
    RETRY_BACKOFF = choice("retry_backoff")
    SCHEDULED = choice("scheduled")
    EXTERNAL_EVENT = choice("external_event")


# The kinds of waits (``tools.waits.register_wait_kind`` adds them): name -> whether settling a wait of
# the kind resumes its run (``Run.resume``); a kind only its deadline ends is woken (``Run.wake``).
_WAIT_KINDS: dict[str, bool] = {}


def add_wait_kind(name: str, *, resumes_run: bool) -> None:
    """Let runs wait ``name``, a kind of wait; ``resumes_run``: its settlement may resume the run.

    For ``tools.waits.register_wait_kind``, which checks the name first.
    """
    _WAIT_KINDS[name] = resumes_run


def is_wait_kind(value: str) -> bool:
    """Whether ``value`` names a registered kind of wait (what ``Wait.kind`` may hold)."""
    return value in _WAIT_KINDS


def is_waiting_reason(value: str) -> bool:
    """Whether a run may wait ``value``: one of ``WaitingReason`` or a registered kind of wait."""
    return value in WaitingReason.values or value in _WAIT_KINDS


def waiting_reason_choices() -> list[tuple[str, str]]:
    """``[(value, its page word)]`` for every waiting reason, registered kinds included, by value (filters)."""
    return [(value, label(value)) for value in sorted({*WaitingReason.values, *_WAIT_KINDS})]


class FailureType(models.TextChoices):
    MODEL_ERROR = choice("model_error")
    INVALID_MODEL_OUTPUT = choice("invalid_model_output")
    BUDGET_EXHAUSTED = choice("budget_exhausted")
    DEADLINE_EXCEEDED = choice("deadline_exceeded")
    APPROVAL_EXPIRED = choice("approval_expired")
    INCOMPLETE = choice("incomplete")
    INTERNAL_ERROR = choice("internal_error")
    CRASH_LOOP = choice("crash_loop")


class MultitaskStrategy(models.TextChoices):
    """What a new input does when its session already has an active run (docs/design.md#multitask)."""

    ENQUEUE = "enqueue"  # a new run, started when the session is free
    SUPPLEMENT = "supplement"  # added to the busy run's conversation, read before its next model call
    INTERRUPT = "interrupt"  # cancel the active runs, then a new run
    REJECT = "reject"  # 409


class Outcome(models.TextChoices):
    ACHIEVED = choice("achieved")
    NOT_ACHIEVED = choice("not_achieved")


class DeathBlame(models.TextChoices):
    """How the sweeper counted a run's death with work in flight (``runs.engine.recovery.attribute_deaths``)."""

    CULPRIT = choice("culprit")  # its work started last: the death counts toward its crash streak
    BYSTANDER = choice("bystander")  # it died beside the culprit: a loss, not a crash of its own
    # Its worker's flight recorder found its code running beside other runs' code: which killed it is not
    # known, so it is a suspect (advanced in quarantine) without a crash of its own.
    SUSPECT = choice("suspect")
    # Its worker's flight recorder says it was waiting for an answer: a loss that never makes it a suspect.
    CLEARED = choice("cleared")


def _no_cancel_requested(run: "Run") -> bool:
    """Guard: nobody asked to cancel the run (a cancel beats starting, waiting and completing)."""
    return run.cancel_requested_at is None


def _waits_for_a_person(run: "Run") -> bool:
    """Guard: the run waits for an inbox decision or settlement, or for a kind of wait whose settlement
    resumes it (an answer, an outside event), not for a timer alone."""
    return (run.waiting_reason in (WaitingReason.APPROVAL, WaitingReason.RECONCILIATION)
            or _WAIT_KINDS.get(run.waiting_reason, False))


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

    # Their indexes lead the composite ones in Meta.indexes (each foreign key's own index would be a twin).
    session = models.ForeignKey(Session, verbose_name=_("session"), on_delete=models.CASCADE, related_name="runs",
                                db_index=False)
    agent = models.ForeignKey(Agent, verbose_name=_("agent"), on_delete=models.PROTECT, related_name="runs",
                              db_index=False)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("requested by"),
                                     on_delete=models.PROTECT, related_name="requested_runs", db_index=False)
    input = models.TextField(_("input"))
    idempotency_key = models.CharField(_("idempotency key"), max_length=200, null=True, blank=True)
    retry_of = models.ForeignKey("self", verbose_name=_("retry of"), null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="retries")

    status = FSMField(_("status"), default=RunStatus.QUEUED, choices=RunStatus.choices, protected=True)
    phase = models.CharField(_("phase"), max_length=32, choices=Phase.choices, blank=True)
    # No choices: a WaitingReason or a registered kind of wait (is_waiting_reason, checked by ``wait``).
    waiting_reason = models.CharField(_("waiting reason"), max_length=32, blank=True)
    wake_at = models.DateTimeField(_("wake at"), null=True, blank=True)
    failure_type = models.CharField(_("failure type"), max_length=32, choices=FailureType.choices, blank=True)
    outcome = models.CharField(_("outcome"), max_length=32, choices=Outcome.choices, blank=True)
    outcome_reason = models.TextField(
        _("outcome reason"), blank=True,
        help_text=_("Why the completion check decided the outcome (runs.engine.completion), "
                    "e.g. the call that failed."))
    error = models.TextField(_("error"), blank=True)
    final_output = models.TextField(_("final output"), blank=True)

    model_calls = models.PositiveIntegerField(_("model calls"), default=0)
    repair_turns = models.PositiveIntegerField(_("repair turns"), default=0)
    incomplete_nudges = models.PositiveIntegerField(_("incomplete nudges"), default=0)
    input_tokens = models.PositiveIntegerField(_("input tokens"), default=0)
    output_tokens = models.PositiveIntegerField(_("output tokens"), default=0)
    cost_usd = models.DecimalField(_("cost (USD)"), max_digits=12, decimal_places=6, default=0)
    last_event_seq = models.PositiveIntegerField(_("last event seq"), default=0)
    lost_leases = models.PositiveIntegerField(
        _("lost leases"), default=0,
        help_text=_("Times a worker died holding this run with a step or tool call in flight."))
    crash_streak = models.PositiveIntegerField(
        _("crash streak"), default=0,
        help_text=_("Such deaths since the run last made progress; TOLLGATE['MAX_CRASHES_PER_STEP'] ends it."))
    loss_streak = models.PositiveIntegerField(
        _("loss streak"), default=0,
        help_text=_("Deaths with work in flight since the last progress, blamed on this run or not; "
                    "TOLLGATE['MAX_LOSSES_PER_STEP'] ends it."))
    suspect = models.BooleanField(
        _("suspect"), default=False,
        help_text=_("A worker died on this run, maybe by its doing: it is advanced in quarantine until it "
                    "makes progress."))
    death_blame = models.CharField(
        _("death blame"), max_length=16, blank=True, choices=DeathBlame.choices,
        help_text=_("How the sweeper counted the run's last death: culprit, bystander, suspect or "
                    "cleared (empty: not counted yet)."))

    lease_owner = models.CharField(_("lease owner"), max_length=200, blank=True)
    lease_token = models.PositiveBigIntegerField(_("lease token"), default=0,
                                                 help_text=_("Fencing token; grows with every acquisition."))
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True, db_index=True)

    cancel_requested_at = models.DateTimeField(_("cancel requested at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    objects = RunQuerySet.as_manager()  # visible_to / cancellable_by (runs.access)

    class Meta:
        verbose_name = _("run")
        verbose_name_plural = _("runs")
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
        # Each index costs every insert and every update that is not HOT, so
        # none repeats another's leading columns; a session's runs are found
        # by (session, status) even before the table has statistics (by the
        # status alone, a run's end walked every queued run to find its
        # session's next one).
        indexes = [
            models.Index(fields=["session", "status"], name="run_session_status"),
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

    def get_absolute_url(self) -> str:
        """The run's page on the site (timeline, tool calls, inbox items)."""
        return reverse("run-detail", args=[self.pk])

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

    def after_transition(self, from_status: str, before: dict) -> None:
        """A wait of the run ended (it leaves ``waiting`` for another status): once committed, its span goes in
        the run's trace (``runs.base.tracing.record_wait``), from the transition that put it to wait (one query, only
        while traces are recorded). Approval waits have theirs from the decision (``record_decision``)."""
        reason = before.get("waiting_reason")
        if from_status != RunStatus.WAITING or self.status == RunStatus.WAITING or not reason \
                or reason == WaitingReason.APPROVAL or not tracing.recording():
            return
        since = (self.events.filter(type=self.event_type, to_status=RunStatus.WAITING).order_by("-seq")
                 .values_list("created_at", flat=True).first())
        if since is not None:
            ended, status = timezone.now(), self.status
            transaction.on_commit(lambda: tracing.record_wait(self, reason, since=since, until=ended, then=status))

    # --- transitions (docs/design.md#run-status) -------------------------

    @transition(field=status, source=RunStatus.QUEUED, target=RunStatus.RUNNING, conditions=[_no_cancel_requested])
    def start(self):
        self.phase = Phase.PREPARING_CONTEXT
        self.started_at = timezone.now()
        self.waiting_reason = ""  # a run created with start_at waited "scheduled" while queued
        self.wake_at = None

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.WAITING, conditions=[_no_cancel_requested])
    def wait(self, waiting_reason: str, wake_at=None):
        """The run waits ``waiting_reason`` (``is_waiting_reason``, else ``ImproperlyConfigured``: a kind of
        wait whose app is not installed) until ``wake_at`` or a settlement."""
        if not is_waiting_reason(waiting_reason):
            raise ImproperlyConfigured(f"No kind of wait {waiting_reason!r} is registered.")
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
        STARTED = choice("started")
        SUCCEEDED = choice("succeeded")
        FAILED = choice("failed")
        DISCARDED = choice("discarded")

    event_type = "model_call"

    # Found through step_index_per_run's index, which (run, index) leads: no index of its own.
    run = models.ForeignKey(Run, verbose_name=_("run"), on_delete=models.CASCADE, related_name="steps", db_index=False)
    index = models.PositiveIntegerField(_("index"))
    status = FSMField(_("status"), max_length=16, choices=Status.choices, default=Status.STARTED, protected=True)
    request = models.JSONField(_("request"), default=dict, decoder=StoredJSONDecoder)
    response = models.JSONField(_("response"), default=dict, decoder=StoredJSONDecoder)
    input_tokens = models.PositiveIntegerField(_("input tokens"), default=0)
    output_tokens = models.PositiveIntegerField(_("output tokens"), default=0)
    cost_usd = models.DecimalField(_("cost (USD)"), max_digits=12, decimal_places=6, default=0)
    error = models.TextField(_("error"), blank=True)
    started_at = models.DateTimeField(_("started at"), auto_now_add=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("step")
        verbose_name_plural = _("steps")
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
    def fail(self, *, error: str, now, transient: bool = False, server: dict | None = None):
        """The call failed (a provider error) or its response could not be understood.

        ``error``: readable by whoever may read the run (docs/design.md#model-errors). ``server``: ``{"status", "message"}``
        (``ModelError.server_answer``), kept as ``response["error"]``; ``transient`` adds ``"transient": true`` there.
        """
        self.error = error
        self.finished_at = now
        if transient or server:
            self.response = {"error": {**(server or {}), **({"transient": True} if transient else {})}}

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

    session = models.ForeignKey(Session, verbose_name=_("session"), on_delete=models.CASCADE, related_name="messages")
    run = models.ForeignKey(Run, verbose_name=_("run"), on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(_("role"), max_length=16)
    content = models.TextField(_("content"), blank=True)
    tool_calls = models.JSONField(_("tool calls"), default=list, blank=True, decoder=StoredJSONDecoder)
    tool_call_id = models.CharField(_("tool call id"), max_length=100, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        ordering = ["id"]

    def __str__(self):
        return f"{self.role} message {self.pk}"


class RunEvent(models.Model):
    """Append-only audit log of a run; ``seq`` grows by one per run.

    ``type`` is e.g. ``transition``, ``model_call``, ``tool_call``,
    ``interrupt``, ``error``. For transitions ``from_status``/``to_status``
    are set. ``actor`` is ``system``, ``worker`` or ``user:<username>``.
    """

    # Found through event_seq_per_run's index, which (run, seq) leads: no index of its own.
    run = models.ForeignKey(Run, verbose_name=_("run"), on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField(_("seq"))
    type = models.CharField(_("type"), max_length=32)
    from_status = models.CharField(_("from status"), max_length=32, blank=True)
    to_status = models.CharField(_("to status"), max_length=32, blank=True)
    actor = models.CharField(_("actor"), max_length=200)
    reason = models.TextField(_("reason"), blank=True)
    payload = models.JSONField(_("payload"), default=dict, blank=True, decoder=StoredJSONDecoder)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("run event")
        verbose_name_plural = _("run events")
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="event_seq_per_run")]

    def __str__(self):
        return f"event {self.seq} of run {self.run_id}: {self.type}"


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

    user = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("user"), on_delete=models.CASCADE,
                             related_name="+")
    scope = models.CharField(_("scope"), max_length=200)
    key = models.CharField(_("key"), max_length=200)
    fingerprint = models.CharField(_("fingerprint"), max_length=64)
    response_status = models.PositiveSmallIntegerField(_("response status"), null=True, blank=True)
    response_body = models.JSONField(_("response body"), null=True, blank=True, encoder=DjangoJSONEncoder,
                                     decoder=StoredJSONDecoder)
    started_at = models.DateTimeField(
        _("started at"), help_text=_("When the request holding the key began (a stale one is taken over)."))
    expires_at = models.DateTimeField(_("expires at"), db_index=True)

    class Meta:
        verbose_name = _("idempotent request")
        verbose_name_plural = _("idempotent requests")
        constraints = [models.UniqueConstraint(fields=["user", "scope", "key"], name="idempotent_request_per_user_scope")]

    def __str__(self):
        return f"{self.scope} {self.key!r} of user {self.user_id}"
