import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0004_run_tenant_status_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='approval',
            name='sub_run',
            field=models.ForeignKey(
                blank=True, help_text="The skill's sub-run whose tool call waits; empty for a call of the run itself.",
                null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='agent_sessions.run',
            ),
        ),
    ]
