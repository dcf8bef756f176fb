"""An empty ``Agent.tools`` list meant every registered tool; from now on it means none (issue 22).

So that no agent loses its tools in the upgrade, every agent saved with an
empty list before it gets the tools registered when this migration runs
(what it could call until then), listed by name: visible in the admin and
the API, and it no longer grows when a tool is added. Reversing leaves the
lists as they are.
"""

from django.db import migrations

from tools.registry import all_tools


def list_every_tool(apps, schema_editor):
    """Give each agent with an empty ``tools`` list the names of the tools registered now."""
    names = [tool.name for tool in all_tools()]
    Agent = apps.get_model("runs", "Agent")
    empty = [agent for agent in Agent.objects.only("pk", "tools") if not agent.tools]
    for agent in empty:
        agent.tools = names
    Agent.objects.bulk_update(empty, ["tools"])


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0014_stored_json_decoder"),
    ]

    operations = [
        migrations.RunPython(list_every_tool, migrations.RunPython.noop),
    ]
