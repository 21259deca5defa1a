"""LLMCall purpose ``compaction``: a run's context compaction (its summary call) is recorded
with its own purpose instead of ``turn``.

Choices only: no SQL runs (Django keeps choices in Python). Rows written before this stay
``turn``: nothing on an old row tells a compaction's call from a turn's.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0009_usage_month'),
    ]

    operations = [
        migrations.AlterField(
            model_name='llmcall',
            name='purpose',
            field=models.CharField(choices=[('turn', 'Run turn'), ('title', 'Chat title'), ('memory', 'Memory extraction'), ('query_rewrite', 'Query rewrite'), ('rerank', 'Rerank'), ('compaction', 'Compaction')], default='turn', max_length=16),
        ),
    ]
