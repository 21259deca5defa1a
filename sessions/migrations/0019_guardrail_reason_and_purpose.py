"""Run.reason ``guardrail_tripped`` (a guardrail of the agent stopped the run) and LLMCall.purpose
``guardrail`` (a guardrail's model check). Choices only: no database change."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0018_run_routing_structured'),
    ]

    operations = [
        migrations.AlterField(
            model_name='run',
            name='reason',
            field=models.CharField(blank=True, choices=[('model_unavailable', 'Every route entry failed'), ('model_error', 'The model request was rejected'), ('stream_interrupted', "The model's stream broke after it started"), ('max_loop_count', 'The loop limit was reached without an answer'), ('budget_exceeded', 'A token or cost budget would be exceeded'), ('context_window', 'The conversation does not fit any route entry'), ('turn_timeout', "A model turn took longer than the agent's turn timeout"), ('compaction_failed', 'The conversation could not be compacted to fit'), ('configuration', "The agent's configuration is unusable"), ('capability_unavailable', 'A bound capability could not be reached'), ('run_timeout', "The run took longer than the agent's run timeout"), ('worker_lost', 'The worker running it died too many times'), ('approval_expired', 'An approval was not given in time'), ('output_invalid', 'The answer did not match the requested format after the repair turns'), ('guardrail_tripped', 'A guardrail of the agent stopped the run'), ('internal_error', 'Internal error')], max_length=40),
        ),
        migrations.AlterField(
            model_name='llmcall',
            name='purpose',
            field=models.CharField(choices=[('turn', 'Run turn'), ('title', 'Chat title'), ('memory', 'Memory extraction'), ('query_rewrite', 'Query rewrite'), ('rerank', 'Rerank'), ('compaction', 'Compaction'), ('evaluation', 'Evaluation'), ('guardrail', 'Guardrail')], default='turn', max_length=16),
        ),
    ]
