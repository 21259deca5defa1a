"""Run.reason ``output_invalid``: the answer did not match the format the API caller asked for
(``response_format`` / ``text.format``) after the repair turns. A choices change: no table
rewrite, no SQL.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0014_llmcall_purpose_evaluation'),
    ]

    operations = [
        migrations.AlterField(
            model_name='run',
            name='reason',
            field=models.CharField(blank=True, choices=[('model_unavailable', 'Every route entry failed'), ('model_error', 'The model request was rejected'), ('stream_interrupted', "The model's stream broke after it started"), ('max_loop_count', 'The loop limit was reached without an answer'), ('budget_exceeded', 'A token or cost budget would be exceeded'), ('context_window', 'The conversation does not fit any route entry'), ('turn_timeout', "A model turn took longer than the agent's turn timeout"), ('compaction_failed', 'The conversation could not be compacted to fit'), ('configuration', "The agent's configuration is unusable"), ('capability_unavailable', 'A bound capability could not be reached'), ('run_timeout', "The run took longer than the agent's run timeout"), ('worker_lost', 'The worker running it died too many times'), ('approval_expired', 'An approval was not given in time'), ('output_invalid', 'The answer did not match the requested format after the repair turns'), ('internal_error', 'Internal error')], max_length=40),
        ),
    ]
