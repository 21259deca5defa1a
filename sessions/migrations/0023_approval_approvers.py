# Approvals by the right person (issue 39): who may decide, and what the expiry does.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0022_llm_call_body'),
    ]

    operations = [
        migrations.AddField(
            model_name='approval',
            name='approvers',
            field=models.JSONField(blank=True, default=dict, help_text='Who may decide, resolved when asked: {"requester": bool, "roles": [role, ...], "user_ids": [id, ...]} (the rule\'s approvers; members named by e-mail resolved to users of the tenant). Empty: the run\'s user (the default).'),
        ),
        migrations.AddField(
            model_name='approval',
            name='on_timeout',
            field=models.CharField(blank=True, choices=[('', 'Fail the run (approval_expired)'), ('deny', 'Deny the call; the run goes on'), ('approve', 'Approve the call; the run goes on')], default='', help_text='What happens at expires_at when nobody decided: the run fails (empty), or the call is denied or approved and the run goes on.', max_length=8),
        ),
    ]
