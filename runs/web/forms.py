"""Forms of the run pages."""

from django import forms
from django.utils.translation import gettext_lazy as _

from runs.selectors import agent_choices


class AgentChoiceField(forms.ModelChoiceField):
    """Agents shown by name, with the slug that names them in the API."""

    def label_from_instance(self, agent) -> str:
        return f"{agent.name} ({agent.slug})"


class StartRunForm(forms.Form):
    """Start a run: which agent (none chosen at first: the user picks one), and the user's input."""

    agent = AgentChoiceField(queryset=agent_choices(), to_field_name="slug", empty_label=_("Choose an agent"))
    input = forms.CharField(widget=forms.Textarea(attrs={"rows": 6}), strip=True)
