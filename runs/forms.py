"""Forms of the run pages."""

from django import forms

from runs.selectors import agent_choices


class StartRunForm(forms.Form):
    """Start a run: which agent, and the user's input."""

    agent = forms.ModelChoiceField(queryset=agent_choices(), to_field_name="slug", empty_label=None)
    input = forms.CharField(widget=forms.Textarea(attrs={"rows": 6}), strip=True)
