"""REST representations of inbox items and the bodies of decisions."""

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from approvals.models import AnswerFile, Interrupt
from approvals.services import can_decide
from config.api import OutputSerializer, StrictSerializer
from tools.models import ToolCall


class InterruptToolCallSerializer(OutputSerializer):
    """The tool call an approval item is about: what the model asked for."""

    class Meta:
        model = ToolCall
        fields = ["id", "name", "arguments", "raw_arguments"]
        read_only_fields = fields


CHANGES_FIELD = serializers.ListField(child=serializers.DictField(), help_text=(
    "What the approver changed, one entry per changed leaf: `path` (JSON Pointer), `field` (for people), "
    "`change` (`changed`, `added` or `removed`), `proposed` and/or `approved` values. Empty: approved as proposed."))


class AnswerFileSerializer(OutputSerializer):
    """The file a question was answered with: metadata and ``download``, the path to fetch it from."""

    download = serializers.SerializerMethodField()

    class Meta:
        model = AnswerFile
        fields = ["id", "name", "content_type", "size", "sha256", "created_at", "download"]
        read_only_fields = fields

    def get_download(self, answer_file: AnswerFile) -> str:
        return reverse("api:interrupt-file", args=[answer_file.interrupt_id])


class InterruptSerializer(OutputSerializer):
    """An inbox item; ``can_decide`` says whether the requesting user may resolve it.

    ``proposed_arguments`` are the model's; ``edited_arguments`` what an
    approver approved instead (null: approved as proposed); ``changes`` the
    difference per field (``tools.services.edits``); ``answer_file`` the
    file an answered question came with (else null).
    """

    tool_call = InterruptToolCallSerializer(read_only=True)
    resolved_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    claimed_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    can_decide = serializers.SerializerMethodField()
    proposed_arguments = serializers.SerializerMethodField()
    changes = serializers.SerializerMethodField()
    answer_file = serializers.SerializerMethodField()

    class Meta:
        model = Interrupt
        fields = ["id", "kind", "status", "title", "run", "tool_call", "decision", "comment", "proposed_arguments",
                  "edited_arguments", "changes", "required_permission", "resolved_by", "resolved_at", "expires_at",
                  "created_at", "can_decide", "claimed_by", "claimed_at", "answer_file"]
        read_only_fields = fields

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_proposed_arguments(self, interrupt: Interrupt) -> dict | None:
        return interrupt.proposed_arguments()

    @extend_schema_field(CHANGES_FIELD)
    def get_changes(self, interrupt: Interrupt) -> list[dict]:
        return interrupt.argument_changes()

    @extend_schema_field(AnswerFileSerializer(allow_null=True))
    def get_answer_file(self, interrupt: Interrupt) -> dict | None:
        answer_file = getattr(interrupt, "answer_file", None)
        return AnswerFileSerializer(answer_file).data if answer_file is not None else None

    @extend_schema_field(serializers.BooleanField())
    def get_can_decide(self, interrupt: Interrupt) -> bool:
        """``user_may_decide`` when the queryset was annotated (lists: no query per item), else one query."""
        flag = getattr(interrupt, "user_may_decide", None)
        return can_decide(self.context["request"].user, interrupt) if flag is None else flag


class RejectSerializer(StrictSerializer):
    """Body of a rejection: an optional comment, which the model will read."""

    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)


class ApproveSerializer(RejectSerializer):
    """Body of an approval: an optional comment and optionally edited tool arguments."""

    arguments = serializers.DictField(required=False, allow_null=True, default=None,
                                      help_text="Edited arguments to run the tool with instead of the model's.")


class RespondSerializer(StrictSerializer):
    """Body of an answer to an input item: the answer (one of the question's options, when it has them),
    and a file when the question allows one (multipart/form-data)."""

    answer = serializers.CharField(max_length=10_000, allow_blank=True, required=False, default="",
                                   help_text="Given to the model as the ask_user call's result; may be empty "
                                             "when a file comes with it.")
    file = serializers.FileField(required=False, allow_empty_file=True, use_url=False,
                                 help_text="Only in a multipart/form-data body, when the question allows a file; "
                                           "at most TOLLGATE['ANSWER_FILE_MAX_BYTES'] bytes (else 413) of an "
                                           "accepted type (else 400).")


class ReconcileSerializer(StrictSerializer):
    """Body of a reconciliation: did the effect happen, what was checked, and what it returned."""

    succeeded = serializers.BooleanField(help_text="True if the external system shows the effect happened.")
    evidence = serializers.CharField(max_length=10_000, help_text="What you checked (kept in the audit log).")
    result = serializers.JSONField(required=False, allow_null=True, default=None,
                                   help_text="The observed result, given to the model as the tool's result.")
