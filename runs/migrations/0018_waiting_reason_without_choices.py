"""A run's waiting reason and a wait's kind lose their fixed choices: kinds of waits are plug-ins (issue 24).

``Run.waiting_reason`` takes a ``WaitingReason`` or any registered kind of
wait, ``Wait.kind`` a registered kind (``tools.waits.register_wait_kind``);
code checks them (``runs.models.is_waiting_reason``), so a new kind needs no
migration. Only the state changes: the columns and their values stay.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0017_drop_unused_phase_and_failure_types'),
    ]

    operations = [
        migrations.AlterField(
            model_name='run',
            name='waiting_reason',
            field=models.CharField(blank=True, max_length=32, verbose_name='waiting reason'),
        ),
        migrations.AlterField(
            model_name='wait',
            name='kind',
            field=models.CharField(max_length=32, verbose_name='kind'),
        ),
    ]
