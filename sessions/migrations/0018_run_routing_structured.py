# Routing rules (the route chosen per turn) and structured output (the parsed answer) on the run (issue 39).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0017_task_push_config'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='routing',
            field=models.JSONField(blank=True, help_text='Runs of agents with routing rules: the model route chosen, each time it changed: [{turn, rule, route}] (rule "": none matched, the agent\'s own route; agents.routing).', null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='structured',
            field=models.JSONField(blank=True, help_text="A completed run with an output format (the agent's output schema or the caller's response_format): its answer parsed (sessions.runner.structured_output); null otherwise.", null=True),
        ),
    ]
