# Model call records (issue 40): the exact request and response bodies of an LLM call, kept for a
# tenant with Tenant.record_llm_bodies (row-level security: tenants/rls.py adds the policy after migrate).

import django.db.models.deletion
import django.db.models.manager
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0021_run_purpose'),
        ('tenants', '0006_tenant_record_llm_bodies'),
    ]

    operations = [
        migrations.CreateModel(
            name='LLMCallBody',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('request', models.TextField(help_text='The JSON body sent to the provider, as sent.')),
                ('request_bytes', models.PositiveIntegerField(default=0, help_text='Its size before any cut, bytes of UTF-8.')),
                ('request_truncated', models.BooleanField(default=False)),
                ('response', models.TextField(blank=True, help_text='The answer as JSON (a stream assembled); empty: none came.')),
                ('response_bytes', models.PositiveIntegerField(default=0, help_text='Its size before any cut, bytes of UTF-8.')),
                ('response_truncated', models.BooleanField(default=False)),
                ('created_at', models.DateTimeField(help_text="When the call's row was written; retention counts from here.")),
                ('llm_call', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='body', to='agent_sessions.llmcall')),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenants.tenant')),
            ],
            options={
                'verbose_name': 'model call record',
                'ordering': ['llm_call'],
                'abstract': False,
                'base_manager_name': 'all_tenants',
                'default_manager_name': 'all_tenants',
                'indexes': [models.Index(fields=['tenant', 'created_at'], name='llm_call_body_tenant_created')],
            },
            managers=[
                ('all_tenants', django.db.models.manager.Manager()),
            ],
        ),
    ]
