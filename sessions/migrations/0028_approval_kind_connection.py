# A run waits for a person to connect an OAuth MCP server's account (issue 37: the Connect card).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0027_pinned_resource'),
    ]

    operations = [
        migrations.AlterField(
            model_name='approval',
            name='kind',
            field=models.CharField(choices=[('tool_call', 'Approve a tool call'), ('question', "Answer the agent's question (ask_user)"), ('client_tool', 'Run by the API client (its next request brings the result)'), ('elicitation', "Answer an MCP server's request for input (a form or a URL)"), ('sampling', "Approve an MCP server's use of the agent's model"), ('connection', 'Connect an account an MCP server needs (OAuth)')], default='tool_call', max_length=16),
        ),
    ]
