from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0006_chat_management'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='context',
            field=models.JSONField(blank=True, help_text='Blocks the bound capabilities added to the model input when the run started (retrieved passages, memories): [{source, title, text, data}]; null until the run first starts.', null=True),
        ),
    ]
