"""LLM calls of purpose ``evaluation``: an experiment's LLM judge (evaluation.scoring). Choices
only: no database change."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0013_usage_month_runner_counts'),
    ]

    operations = [
        migrations.AlterField(
            model_name='llmcall',
            name='purpose',
            field=models.CharField(choices=[('turn', 'Run turn'), ('title', 'Chat title'), ('memory', 'Memory extraction'), ('query_rewrite', 'Query rewrite'), ('rerank', 'Rerank'), ('compaction', 'Compaction'), ('evaluation', 'Evaluation')], default='turn', max_length=16),
        ),
    ]
