"""The admin's agent form: choices for what the code defines, help for the JSON, the API's checks.

* ``completion_check``: a choice of the checks registered in
  ``runs.engine.completion``;
* ``tools``: ticks for the registered tools (``tools.registry``), each
  saying whether it changes things and when it asks for approval;
* ``model`` and ``approval_policy``: strict JSON (``config.strict_json``)
  with help naming the providers, endpoint profiles and rule forms;
* then ``runs.engine.agents.check_definition``, as the API checks an agent
  (a change against the version it follows: loosening needs the permission).

A value stored before its tool or check was removed from the code stays
selected and listed as "not registered", so saving never drops it in
silence; the check then asks to remove it. Submitted text is shown back as typed when the form has errors.
"""

import json

from django import forms
from django.conf import settings
from django.utils.translation import gettext as _, gettext_lazy

from config.strict_json import StrictJSONFormField
from runs.engine import completion
from runs.engine.agents import LOOSEN_PERMISSION, check_definition
from runs.models import Agent
from runs.providers.registry import PROVIDER_MODULES
from tools.registry import offered_tools

MODEL_EXAMPLE = {"provider": "openai", "model": "gpt-4.1-mini", "endpoint": "openai", "temperature": 0.2}
POLICY_EXAMPLE = {"refund": "amount > 20", "send_email": "always"}


def _with_stored(choices: list[tuple[str, str]], stored) -> list[tuple[str, str]]:
    """``choices`` plus any stored value that is not among them, labelled as not registered."""
    known = {value for value, _label in choices}
    extra = [value for value in stored if isinstance(value, str) and value and value not in known]
    return choices + [(value, _("%(name)s (not registered)") % {"name": value}) for value in extra]


def tool_choices(stored=()) -> list[tuple[str, str]]:
    """``(name, label)`` of every tool an agent may be given (``offered_tools``: registered ones sorted, then
    MCP servers'); the label says side effect and approval rule."""
    choices = []
    for tool in offered_tools():
        if tool.side_effect:
            text = _("%(name)s (changes things; approval: %(rule)s)") % {"name": tool.name, "rule": tool.approval}
        else:
            text = _("%(name)s (read-only; approval: %(rule)s)") % {"name": tool.name, "rule": tool.approval}
        choices.append((tool.name, text))
    return _with_stored(choices, stored)


def check_choices(stored: str = "") -> list[tuple[str, str]]:
    """``(name, name)`` of every registered completion check, sorted."""
    return _with_stored([(name, name) for name in completion.check_names()], [stored])


def _json_example(value) -> str:
    return json.dumps(value, ensure_ascii=False)


class AgentAdminForm(forms.ModelForm):
    """Edits an agent with choices for tools and completion check and checks it as the API does.

    ``editor`` (who saves it) is set by ``AgentAdmin.get_form``; their
    permissions decide what the policy may do. A field that failed its own
    check (bad JSON, a choice not offered) gets no second message from
    ``check_definition``.
    """

    editor = None

    tools = forms.MultipleChoiceField(label=gettext_lazy("Tools"), required=False,
                                      widget=forms.CheckboxSelectMultiple)
    completion_check = forms.ChoiceField(label=gettext_lazy("Completion check"))

    class Meta:
        model = Agent
        fields = "__all__"
        field_classes = {"model": StrictJSONFormField, "approval_policy": StrictJSONFormField}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        instance = self.instance
        fields = self.fields
        fields["tools"].choices = tool_choices(instance.tools if instance.pk else ())
        fields["tools"].help_text = _(
            "The tools the model may call; none ticked: it calls no tools.")
        fields["completion_check"].choices = check_choices(instance.completion_check if instance.pk else "")
        fields["completion_check"].initial = instance.completion_check or "default"
        fields["completion_check"].help_text = _(
            "How code decides, when the model gives its final answer, whether the run achieved its task. "
            "“default”: every tool call must have had its effect (or been corrected by a later one); "
            "the others are checks of a domain, registered in code, and bound by the same rule.")
        if "model" not in fields:  # a view-only page (an older version): the JSON fields are shown, not edited
            return
        fields["model"].help_text = _(
            "A JSON object naming the provider (%(providers)s) and its settings, e.g. %(example)s. "
            "“endpoint” names one of the server's endpoint profiles (%(endpoints)s); keys and addresses "
            "stay in the server's settings. The scripted provider replays a list of “turns”."
        ) % {"providers": ", ".join(PROVIDER_MODULES), "example": _json_example(MODEL_EXAMPLE),
             "endpoints": ", ".join(settings.TOLLGATE["MODEL_ENDPOINTS"]) or "-"}
        fields["approval_policy"].help_text = _(
            "A JSON object mapping a tool's name to when its calls need a person's approval: “always”, "
            "“never”, a condition on the arguments such as “amount > 50”, or a total such as "
            "“sum(amount) per target within 30d > 50”; e.g. %(example)s. It adds to the tool's own rule "
            "(shown beside each tool above): approval is asked when either asks. Only a user with the "
            "permission %(permission)s makes it replace the tool's rule. Empty: the tools' rules alone."
        ) % {"example": _json_example(POLICY_EXAMPLE), "permission": LOOSEN_PERMISSION}

    def clean(self):
        data = super().clean()
        checked = check_definition(data, user=self.editor, before=self.instance if self.instance.pk else None)
        for field, problems in checked.errors.items():
            if field not in self.errors:
                self.add_error(field if field in self.fields else None, problems)
        return data
