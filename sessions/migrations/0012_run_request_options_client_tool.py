"""Run.request_options: what an API caller asked of a run beside the agent's configuration
(client tools, added instructions, a response format); null (every existing row): nothing.
Approval.kind ``client_tool``: a call of a tool the API client runs itself (its next request
brings the result). A nullable column and a choices change: no table rewrite; the row-level
security policies are unchanged.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0011_run_attributions'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='request_options',
            field=models.JSONField(blank=True, help_text="What the API caller asked of this run beside the agent's configuration (the OpenAI-compatible API): {client_tools: [{name, description, parameters}], instructions, response_format}; null: nothing (sessions.runner.spec.RunRequestOptions).", null=True),
        ),
        migrations.AlterField(
            model_name='approval',
            name='kind',
            field=models.CharField(choices=[('tool_call', 'Approve a tool call'), ('question', "Answer the agent's question (ask_user)"), ('client_tool', 'Run by the API client (its next request brings the result)')], default='tool_call', max_length=16),
        ),
    ]
