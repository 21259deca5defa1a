"""A per-agent switch that makes its A2A agent card public (sessions/api/a2a)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("agents", "0006_agent_slug"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentinstance",
            name="a2a_public",
            field=models.BooleanField(
                default=False,
                help_text=(
                    "A2A: anyone may read the agent's card (/a2a/<slug>/.well-known/agent-card.json) without a "
                    "token; calling the agent still needs one of this tenant's API tokens."
                ),
            ),
        ),
    ]
