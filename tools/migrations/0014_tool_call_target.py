from django.db import migrations, models

BATCH = 1000


def fill_targets(apps, schema_editor):
    """Each stored call of a tool registered now with a ``target_key`` gets its target's lock key, so per-target
    approval rules count it through the new index; a call of a tool unknown now keeps "" and is still found by
    its arguments (``tools.services.targets.calls_on``)."""
    from tools.registry import all_tools
    from tools.services.targets import target_key

    ToolCall = apps.get_model("tools", "ToolCall")
    for tool in all_tools():
        if not tool.target_key:
            continue
        calls = ToolCall.objects.filter(name=tool.name, target="").only("pk", "arguments").order_by("pk")
        changed = []
        for call in calls.iterator(chunk_size=BATCH):
            call.target = target_key(tool, call.arguments)
            if call.target:
                changed.append(call)
            if len(changed) >= BATCH:
                ToolCall.objects.bulk_update(changed, ["target"])
                changed = []
        ToolCall.objects.bulk_update(changed, ["target"])


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0021_death_blame_cleared_and_suspect'),
        ('tools', '0013_tool_call_unsent_attempts'),
    ]

    operations = [
        migrations.AddField(
            model_name='toolcall',
            name='target',
            field=models.CharField(blank=True, help_text="What the call acts on (its tool's target argument, as the target's lock key); empty when none. Per-target approval rules count the calls with the same target.", max_length=100, verbose_name='target'),
        ),
        migrations.RunPython(fill_targets, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='toolcall',
            index=models.Index(fields=['target', 'name'], name='toolcall_target'),
        ),
    ]
