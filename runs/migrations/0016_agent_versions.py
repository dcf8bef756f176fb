"""Agents have versions (issue 22): a change is a new row of the same slug (docs/design.md#agent-versions).

Every existing agent becomes version 1 of its slug, current and not
archived (the fields' defaults). The slug is no longer unique on its own:
one row per (slug, version), and one current row per slug. Reversing
drops the versions' fields; it fails while a slug has several versions.
"""

import config.strict_json
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0015_agent_tools_listed'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='agent',
            options={'ordering': ['slug', 'version'], 'permissions': [('loosen_approval_policy', "Can let an agent's approval rules replace the tools' own")], 'verbose_name': 'agent', 'verbose_name_plural': 'agents'},
        ),
        migrations.AddField(
            model_name='agent',
            name='archived_at',
            field=models.DateTimeField(blank=True, editable=False, help_text='Set on the current version when the agent was archived: it takes no new runs or sessions.', null=True, verbose_name='archived at'),
        ),
        migrations.AddField(
            model_name='agent',
            name='created_by',
            field=models.ForeignKey(blank=True, editable=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL, verbose_name='created by'),
        ),
        migrations.AddField(
            model_name='agent',
            name='is_current',
            field=models.BooleanField(default=True, editable=False, help_text='The version new runs and sessions of this slug use.', verbose_name='current'),
        ),
        migrations.AddField(
            model_name='agent',
            name='loosened_tools',
            field=models.JSONField(blank=True, decoder=config.strict_json.StoredJSONDecoder, default=list, editable=False, help_text='Tools whose calls this version asks approval for less often than the version before.', verbose_name='loosened tools'),
        ),
        migrations.AddField(
            model_name='agent',
            name='version',
            field=models.PositiveIntegerField(default=1, editable=False, verbose_name='version'),
        ),
        migrations.AlterField(
            model_name='agent',
            name='slug',
            field=models.SlugField(verbose_name='slug'),
        ),
        migrations.AddConstraint(
            model_name='agent',
            constraint=models.UniqueConstraint(fields=('slug', 'version'), name='agent_slug_version'),
        ),
        migrations.AddConstraint(
            model_name='agent',
            constraint=models.UniqueConstraint(condition=models.Q(('is_current', True)), fields=('slug',), name='agent_one_current_version', violation_error_message='An agent with this slug already exists.'),
        ),
    ]
