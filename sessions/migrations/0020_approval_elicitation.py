"""Approval kind ``elicitation`` (an MCP server's request for input) and its request and answer."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0019_guardrail_reason_and_purpose'),
    ]

    operations = [
        migrations.AddField(
            model_name='approval',
            name='elicitation',
            field=models.JSONField(blank=True, help_text='Kind elicitation: {request: {mode, message, schema, url, server, tool, ...}, action, content} (capabilities.mcp.elicitation); action and content once answered.', null=True),
        ),
        migrations.AlterField(
            model_name='approval',
            name='kind',
            field=models.CharField(choices=[('tool_call', 'Approve a tool call'), ('question', "Answer the agent's question (ask_user)"), ('client_tool', 'Run by the API client (its next request brings the result)'), ('elicitation', "Answer an MCP server's request for input (a form or a URL)")], default='tool_call', max_length=16),
        ),
    ]
