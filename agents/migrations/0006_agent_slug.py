"""Every agent gets a slug, unique in its tenant: it names the agent in the OpenAI-compatible
API, MCP and A2A. Existing agents get one made from their name (``docs-assistant``, then
``-2``, ``-3`` for a second agent of the same tenant whose name gives the same slug) before the
constraint is added."""

from django.db import migrations, models

import agents.models


def _fill_slugs(apps, schema_editor):
    agent_model = apps.get_model("agents", "AgentInstance")
    taken: dict[int, set[str]] = {}
    for agent in agent_model._base_manager.order_by("tenant_id", "id"):
        slugs = taken.setdefault(agent.tenant_id, set())
        agent.slug = agents.models.agent_slug_from_name(agent.name, slugs)
        slugs.add(agent.slug)
        agent.save(update_fields=["slug"])


class Migration(migrations.Migration):

    dependencies = [
        ("agents", "0005_binding_kind_choices_from_registry"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentinstance",
            name="slug",
            field=models.CharField(
                blank=True, max_length=64, validators=[agents.models.slug_validator],
                help_text=(
                    "Names the agent in the OpenAI-compatible API, MCP and A2A; unique in the tenant. "
                    "Left blank: made from the name."
                ),
            ),
        ),
        migrations.RunPython(_fill_slugs, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="agentinstance",
            constraint=models.UniqueConstraint(fields=("tenant", "slug"), name="agent_unique_slug"),
        ),
    ]
