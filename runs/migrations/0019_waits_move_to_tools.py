"""Waits and external events move to the tools app (issue 24): here they leave the runs app's state only.

The tables ``runs_wait`` and ``runs_externalevent`` stay, rows, ids,
constraints and indexes kept: ``tools.Wait`` and ``tools.ExternalEvent``
name them (``db_table``) from tools 0012, which runs after this one and
moves their content types (so permissions, e.g. the right to deliver
events, follow). Nothing is written to the database here.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0018_waiting_reason_without_choices'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.RemoveField(
                model_name='wait',
                name='run',
            ),
            migrations.RemoveField(
                model_name='wait',
                name='tool_call',
            ),
            migrations.DeleteModel(
                name='ExternalEvent',
            ),
            migrations.DeleteModel(
                name='Wait',
            ),
        ]),
    ]
