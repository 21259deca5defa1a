"""ToolCall.server_log (an MCP server's log messages during the call, issue 37) and LLMCall.purpose
``sampling`` (an MCP server's sampling request answered by the run's route)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0023_approval_approvers'),
    ]

    operations = [
        migrations.AddField(
            model_name='toolcall',
            name='server_log',
            field=models.JSONField(blank=True, default=list, help_text="An MCP server's log messages during the call, at or above its binding's log_level: [{level, logger, data, at}] (the run trace shows them; the model never sees them)."),
        ),
        migrations.AlterField(
            model_name='llmcall',
            name='purpose',
            field=models.CharField(choices=[('turn', 'Run turn'), ('title', 'Chat title'), ('memory', 'Memory extraction'), ('query_rewrite', 'Query rewrite'), ('rerank', 'Rerank'), ('compaction', 'Compaction'), ('evaluation', 'Evaluation'), ('guardrail', 'Guardrail'), ('sampling', 'MCP sampling')], default='turn', max_length=16),
        ),
    ]
