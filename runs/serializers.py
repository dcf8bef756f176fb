"""REST representations of agents, runs, their events and tool calls.

Output serializers are read-only views of the models; input serializers
only check the shape of a request body; the services decide the rest.
"""

import re

from rest_framework import serializers

from runs.models import Agent, MultitaskStrategy, Run, RunEvent, Session
from tools.models import ToolCall

# Keys of a model config that may hold credentials; never shown to non-staff.
_SECRET_KEY = re.compile(r"(api_?key|secret|password|token)$", re.IGNORECASE)


class AgentSerializer(serializers.ModelSerializer):
    """An agent definition; credentials in its model config are masked for non-staff."""

    class Meta:
        model = Agent
        fields = ["slug", "name", "instructions", "model", "tools", "max_turns", "completion_check",
                  "approval_policy", "created_at"]
        read_only_fields = fields

    def to_representation(self, instance):
        data = super().to_representation(instance)
        request = self.context.get("request")
        if isinstance(data["model"], dict) and not (request and request.user.is_staff):
            data["model"] = {k: "***" if _SECRET_KEY.search(k) else v for k, v in data["model"].items()}
        return data


class AgentCreateSerializer(serializers.Serializer):
    """Body of ``POST /api/agents/``; ``runs.agents.create_agent`` validates the content."""

    slug = serializers.CharField(max_length=50)
    name = serializers.CharField(max_length=200)
    instructions = serializers.CharField(required=False, allow_blank=True, default="")
    model = serializers.JSONField(help_text='Provider config, e.g. {"provider": "scripted", "turns": [...]}.')
    tools = serializers.ListField(child=serializers.CharField(), required=False,
                                  help_text="Registered tool names; omitted or empty: every tool.")
    max_turns = serializers.IntegerField(required=False, min_value=1)
    completion_check = serializers.CharField(required=False)
    approval_policy = serializers.DictField(child=serializers.CharField(), required=False,
                                            help_text='Tool name to rule: "always", "never" or e.g. "amount > 50".')


class RunSerializer(serializers.ModelSerializer):
    """A run: status fields, usage, timestamps; ``agent`` by slug, requester by username.

    ``outcome`` and ``outcome_reason`` are the program's verdict (``runs.completion``);
    ``final_output`` is the model's own last words, not a verdict.
    """

    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Run
        fields = ["id", "status", "phase", "waiting_reason", "failure_type", "outcome", "outcome_reason", "session",
                  "agent",
                  "requested_by", "input", "final_output", "error", "wake_at", "cancel_requested_at", "retry_of",
                  "model_calls", "input_tokens", "output_tokens", "created_at", "updated_at", "started_at",
                  "finished_at"]
        read_only_fields = fields


class RunCreateSerializer(serializers.Serializer):
    """Body of ``POST /api/runs/``: the agent's slug, the input, optionally a session to continue."""

    agent = serializers.SlugRelatedField(slug_field="slug", queryset=Agent.objects.all())
    input = serializers.CharField(help_text="The user's request; limited to TOLLGATE['MAX_INPUT_CHARS'] characters.")
    session = serializers.PrimaryKeyRelatedField(queryset=Session.objects.none(), required=False, allow_null=True,
                                                 help_text="One of your sessions, to continue it; omitted: a new one.")
    multitask_strategy = serializers.ChoiceField(
        choices=MultitaskStrategy.values, default=MultitaskStrategy.ENQUEUE,
        help_text="If the session has an active run: enqueue (default), supplement, interrupt or reject (409).")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.fields["session"].queryset = Session.objects.filter(owner=request.user)


class RunEventSerializer(serializers.ModelSerializer):
    """One entry of a run's append-only event log."""

    class Meta:
        model = RunEvent
        fields = ["seq", "type", "from_status", "to_status", "actor", "reason", "payload", "created_at"]
        read_only_fields = fields


class ToolCallSerializer(serializers.ModelSerializer):
    """One tool call of a run: raw and parsed arguments, status, result or error.

    ``duplicate_of``: the id of the earlier call whose action this one repeats (it ends as that one ended).
    """

    class Meta:
        model = ToolCall
        fields = ["id", "name", "status", "raw_arguments", "arguments", "result", "error", "idempotency_key",
                  "attempts", "side_effect", "duplicate_of", "provider_call_id", "created_at", "started_at",
                  "finished_at"]
        read_only_fields = fields
