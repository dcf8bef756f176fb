"""``RunEvent.run`` and ``Step.run`` without an index of their own: the unique (run, seq) and (run, index)
constraints' indexes lead with the run already, and every event and step insert wrote both."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0022_fewer_twin_indexes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='runevent',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='runs.run', verbose_name='run'),
        ),
        migrations.AlterField(
            model_name='step',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='runs.run', verbose_name='run'),
        ),
    ]
