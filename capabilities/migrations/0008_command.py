# Slash commands (issue 37): a tenant's Markdown templates bound to agents (kind "command").

import django.core.validators
import django.db.models.deletion
import django.db.models.manager
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('capabilities', '0007_mcp_oauth'),
        ('tenants', '0004_audit_append_only'),
    ]

    operations = [
        migrations.CreateModel(
            name='Command',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(help_text='Typed after / in the chat: /name.', max_length=64, validators=[django.core.validators.RegexValidator('^[a-z0-9][a-z0-9_-]{0,63}$', "Lowercase letters, digits, '_' and '-' (at most 64), starting with a letter or digit.")])),
                ('description', models.CharField(blank=True, help_text="Shown in the chat's command list.", max_length=500)),
                ('template', models.TextField(help_text='Markdown put into the message box: $ARGUMENTS is what was typed after the name, $name (or ${name}) a named argument\'s value, $$ a literal $.')),
                ('arguments', models.JSONField(blank=True, default=list, help_text='Named arguments, asked for in a small form: [{"name": "language", "description": "…", "required": true}, …].')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenants.tenant')),
            ],
            options={
                'ordering': ['name'],
                'abstract': False,
                'base_manager_name': 'all_tenants',
                'default_manager_name': 'all_tenants',
                'constraints': [models.UniqueConstraint(fields=('tenant', 'name'), name='command_unique_name')],
            },
            managers=[
                ('all_tenants', django.db.models.manager.Manager()),
            ],
        ),
    ]
