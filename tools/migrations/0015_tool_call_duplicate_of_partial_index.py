"""``ToolCall.duplicate_of`` indexed only where set (re-proposals), not every call's NULL.

The full index was the planner's pick for ``duplicate_of IS NULL`` (the
calls a cumulative approval rule counts) while a fresh, fast-growing table
had no statistics yet: a walk of every call. The partial one serves every
lookup of a call's duplicates (``duplicate_of = X`` implies it is set)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0021_death_blame_cleared_and_suspect'),
        ('tools', '0014_tool_call_target'),
    ]

    operations = [
        migrations.AlterField(
            model_name='toolcall',
            name='duplicate_of',
            field=models.ForeignKey(blank=True, db_index=False, help_text='The earlier call of the same action.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='duplicates', to='tools.toolcall', verbose_name='duplicate of'),
        ),
        migrations.AddIndex(
            model_name='toolcall',
            index=models.Index(condition=models.Q(('duplicate_of__isnull', False)), fields=['duplicate_of'], name='toolcall_duplicate_of'),
        ),
    ]
