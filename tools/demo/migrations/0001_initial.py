"""The demo app's ``Order``, taking over the orders the tools app held until the demo became an app.

Where ``tools_order`` still exists (tools 0006 leaves it when it holds
orders) it is renamed to ``demo_order``: rows, ids, constraints and
indexes kept. Elsewhere (a new database, or one without orders)
``demo_order`` is created. The orders' content type moves from the tools
app to this one, so permissions on orders and their admin history follow.
Going back renames the table to ``tools_order`` again, orders included.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

OLD_TABLE = "tools_order"


def take_over_or_create_table(apps, schema_editor):
    Order = apps.get_model("demo", "Order")
    if OLD_TABLE in schema_editor.connection.introspection.table_names():
        schema_editor.alter_db_table(Order, OLD_TABLE, Order._meta.db_table)
    else:
        schema_editor.create_model(Order)


def give_table_back(apps, schema_editor):
    Order = apps.get_model("demo", "Order")
    schema_editor.alter_db_table(Order, Order._meta.db_table, OLD_TABLE)


def _move_content_type(apps, schema_editor, source: str, target: str):
    types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
    if not types.filter(app_label=target, model="order").exists():
        types.filter(app_label=source, model="order").update(app_label=target)


def content_type_to_demo(apps, schema_editor):
    _move_content_type(apps, schema_editor, "tools", "demo")


def content_type_to_tools(apps, schema_editor):
    _move_content_type(apps, schema_editor, "demo", "tools")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('tools', '0006_order_moves_to_demo'),
        ('contenttypes', '0002_remove_content_type_name'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Order',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('number', models.PositiveIntegerField(unique=True)),
                        ('total', models.DecimalField(decimal_places=2, max_digits=10)),
                        ('shipped', models.BooleanField(default=False)),
                        ('status', models.CharField(choices=[('open', 'Open'), ('cancelled', 'Cancelled')], default='open', max_length=16)),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='orders', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'ordering': ['number'],
                    },
                ),
            ],
        ),
        migrations.RunPython(take_over_or_create_table, give_table_back),
        migrations.RunPython(content_type_to_demo, content_type_to_tools),
    ]
