# MCP resources pinned to a chat (issue 37): read at the start of every later run of the chat
# (row-level security: tenants/rls.py adds the policy after migrate).

import django.db.models.deletion
import django.db.models.manager
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0026_run_held_back'),
        ('capabilities', '0010_mcp_oauth_client_credentials'),
        ('tenants', '0006_tenant_record_llm_bodies'),
    ]

    operations = [
        migrations.CreateModel(
            name='PinnedResource',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('uri', models.CharField(help_text="The resource's absolute URI (a template's, filled in).", max_length=2000)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('mcp_server', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='capabilities.mcpserver')),
                ('session', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='pinned_resources', to='agent_sessions.chatsession')),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenants.tenant')),
            ],
            options={
                'ordering': ['session', 'id'],
                'abstract': False,
                'base_manager_name': 'all_tenants',
                'default_manager_name': 'all_tenants',
                'constraints': [models.UniqueConstraint(fields=('session', 'mcp_server', 'uri'), name='pinned_resource_unique_uri')],
            },
            managers=[
                ('all_tenants', django.db.models.manager.Manager()),
            ],
        ),
    ]
