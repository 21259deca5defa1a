"""Run.attributions: the platform's attribution of an answer that cites none of its passages
(knowledge.attribution), ``[{sentence_start, sentence_end, n, chunk_id, score}]``; null (every
existing row): not attempted. A nullable column: no table rewrite; Run is tenant-owned, its
row-level security policy is unchanged.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0010_llmcall_purpose_compaction'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='attributions',
            field=models.JSONField(blank=True, help_text='The platform\'s attribution of an answer that cites none of its passages: [{sentence_start, sentence_end, n, chunk_id, score}] (offsets in reply; knowledge.attribution); null: not attempted (the answer cites, there was no passage, or attribution failed).', null=True),
        ),
    ]
