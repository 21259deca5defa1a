# Model call records (issue 40): a tenant's opt-in to keeping its model calls' bodies, and for how long.
# Database defaults too, so a process of the previous release inserts tenants during a rolling deploy.

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0005_tenant_trace_content'),
    ]

    operations = [
        migrations.AddField(
            model_name='tenant',
            name='record_llm_bodies',
            field=models.BooleanField(db_default=False, default=False, help_text="Model call records: keep the exact request and response bodies of this tenant's model calls (shown to its admins in the console's run trace; provider keys are never kept). Off: calls keep tokens, timings and outcomes only, and the bodies kept so far are deleted within the hour."),
        ),
        migrations.AddField(
            model_name='tenant',
            name='llm_body_retention_days',
            field=models.PositiveSmallIntegerField(db_default=7, default=7, help_text='Model call records are deleted this many days after the call (1–90).', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(90)]),
        ),
        migrations.AddConstraint(
            model_name='tenant',
            constraint=models.CheckConstraint(condition=models.Q(('llm_body_retention_days__gte', 1), ('llm_body_retention_days__lte', 90)), name='tenant_llm_body_retention_days_range'),
        ),
    ]
