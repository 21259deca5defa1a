"""Approval kind ``sampling``: a person approves an MCP server's use of the agent's model (issue 37)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0024_toolcall_server_log_sampling'),
    ]

    operations = [
        migrations.AlterField(
            model_name='approval',
            name='kind',
            field=models.CharField(choices=[('tool_call', 'Approve a tool call'), ('question', "Answer the agent's question (ask_user)"), ('client_tool', 'Run by the API client (its next request brings the result)'), ('elicitation', "Answer an MCP server's request for input (a form or a URL)"), ('sampling', "Approve an MCP server's use of the agent's model")], default='tool_call', max_length=16),
        ),
    ]
