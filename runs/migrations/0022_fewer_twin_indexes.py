"""No index of ``runs_run`` repeats another's leading columns; a session's runs found by (session, status).

The status, agent and requester each led a composite index of the lists
already (``run_status_created``, ``run_agent_created``,
``run_requester_created``), and the status had a LIKE-pattern twin as
well: four indexes every insert and every update that is not HOT wrote
for nothing. The session's own index becomes (session, status), which a
run's end reads for its session's next queued run: by the status index
alone, before the table had statistics, that walked every queued run."""

import django.db.models.deletion
import django_fsm
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0021_death_blame_cleared_and_suspect'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='run',
            name='agent',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='runs.agent', verbose_name='agent'),
        ),
        migrations.AlterField(
            model_name='run',
            name='requested_by',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='requested_runs', to=settings.AUTH_USER_MODEL, verbose_name='requested by'),
        ),
        migrations.AlterField(
            model_name='run',
            name='session',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='runs', to='runs.session', verbose_name='session'),
        ),
        migrations.AlterField(
            model_name='run',
            name='status',
            field=django_fsm.FSMField(choices=[('queued', 'queued'), ('running', 'running'), ('waiting', 'waiting'), ('completed', 'completed'), ('failed', 'failed'), ('cancelled', 'cancelled')], default='queued', max_length=50, protected=True, verbose_name='status'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(fields=['session', 'status'], name='run_session_status'),
        ),
    ]
