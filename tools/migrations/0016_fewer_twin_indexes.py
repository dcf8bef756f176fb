"""``ToolCall.status`` and ``action_key`` indexed for equality only.

A field's ``db_index`` adds a LIKE-pattern twin on PostgreSQL that no
query reads; every insert writes it, and so does every status change (no
update of a call is HOT: its status is indexed)."""

import django_fsm
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0022_fewer_twin_indexes'),
        ('tools', '0015_tool_call_duplicate_of_partial_index'),
    ]

    operations = [
        migrations.AlterField(
            model_name='toolcall',
            name='action_key',
            field=models.CharField(blank=True, max_length=64, verbose_name='action key'),
        ),
        migrations.AlterField(
            model_name='toolcall',
            name='status',
            field=django_fsm.FSMField(choices=[('proposed', 'proposed'), ('invalid', 'invalid'), ('denied', 'denied'), ('awaiting_approval', 'awaiting approval'), ('ready', 'ready'), ('rejected', 'rejected'), ('expired', 'expired'), ('cancelled', 'cancelled'), ('running', 'running'), ('succeeded', 'succeeded'), ('failed', 'failed'), ('unknown', 'unknown')], default='proposed', max_length=50, protected=True, verbose_name='status'),
        ),
        migrations.AddIndex(
            model_name='toolcall',
            index=models.Index(fields=['status'], name='toolcall_status'),
        ),
        migrations.AddIndex(
            model_name='toolcall',
            index=models.Index(fields=['action_key'], name='toolcall_action_key'),
        ),
    ]
