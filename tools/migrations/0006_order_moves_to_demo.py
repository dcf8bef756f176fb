"""The demo shop's ``Order`` leaves the tools app: it belongs to the demo app (``tools.demo``) now.

The model leaves this app's state. Its table ``tools_order`` is dropped
when it holds no orders. Orders that exist are never deleted by a
migration: the table is left as it is, and the demo app's first migration
(which runs after this one) takes it over, rows and ids kept; a product
without the demo app simply keeps the table, unused. Going back
re-creates an empty ``tools_order`` unless the table is still there.
"""

from django.db import migrations

TABLE = "tools_order"


def drop_table_unless_it_holds_orders(apps, schema_editor):
    Order = apps.get_model("tools", "Order")
    if not Order.objects.using(schema_editor.connection.alias).exists():
        schema_editor.delete_model(Order)


def recreate_table_if_missing(apps, schema_editor):
    if TABLE not in schema_editor.connection.introspection.table_names():
        schema_editor.create_model(apps.get_model("tools", "Order"))


class Migration(migrations.Migration):

    dependencies = [
        ('tools', '0005_policy_lock'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='Order')],
            database_operations=[
                migrations.RunPython(drop_table_unless_it_holds_orders, recreate_table_if_missing),
            ],
        ),
    ]
