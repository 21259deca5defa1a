"""LLMCall rows for calls outside a run's turns, kept when their run is purged.

``run`` and ``turn`` become nullable (``run`` SET_NULL: a purged chat's calls stay counted);
``purpose`` (existing rows: ``turn``), ``agent`` and ``user`` are added, and existing rows get
their run's agent and user in one ``UPDATE … FROM`` (no Python loop over the rows).
Reversing deletes the rows without a run (calls outside a run's turns, purged chats' calls):
the old schema has no place for them.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def _fill_agent_and_user(apps, schema_editor):
    call = apps.get_model("agent_sessions", "LLMCall")._meta.db_table
    run = apps.get_model("agent_sessions", "Run")._meta.db_table
    session = apps.get_model("agent_sessions", "ChatSession")._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "{call}" AS c SET "agent_id" = s."agent_id", "user_id" = r."user_id" '
            f'FROM "{run}" AS r JOIN "{session}" AS s ON s."id" = r."session_id" '
            'WHERE c."run_id" = r."id" AND c."agent_id" IS NULL AND c."user_id" IS NULL'
        )


def _drop_runless_calls(apps, schema_editor):
    apps.get_model("agent_sessions", "LLMCall")._base_manager.filter(run__isnull=True).delete()


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0007_run_context'),
        ('agents', '0005_binding_kind_choices_from_registry'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='llmcall',
            name='agent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='agents.agentinstance'),
        ),
        migrations.AddField(
            model_name='llmcall',
            name='purpose',
            field=models.CharField(choices=[('turn', 'Run turn'), ('title', 'Chat title'), ('memory', 'Memory extraction'), ('query_rewrite', 'Query rewrite'), ('rerank', 'Rerank')], default='turn', max_length=16),
        ),
        migrations.AddField(
            model_name='llmcall',
            name='user',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='llmcall',
            name='run',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='llm_calls', to='agent_sessions.run'),
        ),
        migrations.AlterField(
            model_name='llmcall',
            name='turn',
            field=models.PositiveIntegerField(blank=True, help_text="The run's 0-based turn; empty outside a run.", null=True),
        ),
        migrations.RunPython(_fill_agent_and_user, _drop_runless_calls),
    ]
