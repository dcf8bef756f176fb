"""Every machine value a page shows has a page word in ``runs.base.labels.LABELS`` (README "Languages and time zones").

That the words are translated is tests/web/test_i18n.py (the catalogue).
"""

from approvals.models import Decision, InterruptKind, InterruptStatus
from runs.base.labels import LABELS
from runs.models import DeathBlame, FailureType, Outcome, Phase, RunStatus, WaitingReason
from tools.models import ToolCallStatus


def test_every_value_shown_on_pages_has_a_label():
    enumerations = [RunStatus, Phase, WaitingReason, FailureType, Outcome, DeathBlame, InterruptKind, InterruptStatus,
                    Decision, ToolCallStatus]
    values = {value for enumeration in enumerations for value in enumeration.values}
    values |= {"user", "assistant", "tool", "system"}  # Message.role
    assert sorted(values - set(LABELS)) == []
