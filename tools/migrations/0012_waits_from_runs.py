"""Waits and external events come to the tools app from the runs app (issue 24), tables and rows kept.

State only: the models name the tables they always had (``runs_wait``,
``runs_externalevent``; runs 0019 took them out of the runs app's state).
The database changes in one way: the two models' content types move from
``runs`` to ``tools``, so their permissions keep their rows and grants
(the right to deliver events is ``tools.add_externalevent`` from now on)
and their admin history follows. Going back moves them to ``runs`` again.
"""

import config.strict_json
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MODELS = ("wait", "externalevent")


def _move_content_types(apps, schema_editor, source: str, target: str):
    types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
    for model in MODELS:
        if not types.filter(app_label=target, model=model).exists():
            types.filter(app_label=source, model=model).update(app_label=target)


def content_types_to_tools(apps, schema_editor):
    _move_content_types(apps, schema_editor, "runs", "tools")


def content_types_to_runs(apps, schema_editor):
    _move_content_types(apps, schema_editor, "tools", "runs")


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0019_waits_move_to_tools'),
        ('tools', '0011_mcp_tool_approval_rule'),
        ('contenttypes', '0002_remove_content_type_name'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Wait',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(max_length=32, verbose_name='kind')),
                        ('status', models.CharField(choices=[('pending', 'pending'), ('done', 'done'), ('timed_out', 'timed out'), ('refused', 'refused'), ('cancelled', 'cancelled')], db_index=True, default='pending', max_length=16, verbose_name='status')),
                        ('event_type', models.CharField(blank=True, max_length=100, verbose_name='event type')),
                        ('correlation_key', models.CharField(blank=True, max_length=200, verbose_name='correlation key')),
                        ('deadline', models.DateTimeField(help_text='When the wait ends: the time itself (scheduled), else its timeout.', verbose_name='deadline')),
                        ('result', models.JSONField(blank=True, decoder=config.strict_json.StoredJSONDecoder, help_text="The tool call's result once done.", null=True, verbose_name='result')),
                        ('error', models.TextField(blank=True, help_text='Why the tool call fails (timed out, refused).', verbose_name='error')),
                        ('created_at', models.DateTimeField(auto_now_add=True, verbose_name='created at')),
                        ('settled_at', models.DateTimeField(blank=True, null=True, verbose_name='settled at')),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='waits', to='runs.run', verbose_name='run')),
                        ('tool_call', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='wait', to='tools.toolcall', verbose_name='tool call')),
                    ],
                    options={
                        'verbose_name': 'wait',
                        'verbose_name_plural': 'waits',
                        'db_table': 'runs_wait',
                        'ordering': ['id'],
                    },
                ),
                migrations.CreateModel(
                    name='ExternalEvent',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('type', models.CharField(max_length=100, verbose_name='type')),
                        ('key', models.CharField(max_length=200, verbose_name='key')),
                        ('payload', models.JSONField(blank=True, decoder=config.strict_json.StoredJSONDecoder, default=dict, verbose_name='payload')),
                        ('received_at', models.DateTimeField(auto_now_add=True, verbose_name='received at')),
                        ('received_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL, verbose_name='received by')),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='external_events', to='runs.run', verbose_name='run')),
                        ('wait', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='event', to='tools.wait', verbose_name='wait')),
                    ],
                    options={
                        'verbose_name': 'external event',
                        'verbose_name_plural': 'external events',
                        'db_table': 'runs_externalevent',
                        'ordering': ['id'],
                    },
                ),
                migrations.AddConstraint(
                    model_name='wait',
                    constraint=models.UniqueConstraint(condition=models.Q(('kind', 'external_event'), ('status', 'pending')), fields=('event_type', 'correlation_key'), name='one_pending_wait_per_event_key'),
                ),
                migrations.AddConstraint(
                    model_name='externalevent',
                    constraint=models.UniqueConstraint(fields=('type', 'key'), name='external_event_type_key'),
                ),
            ],
            database_operations=[migrations.RunPython(content_types_to_tools, content_types_to_runs)],
        ),
    ]
