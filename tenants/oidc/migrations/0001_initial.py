# Single sign-on (issue 40): the link of a user to their account at the OpenID Connect provider.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='OidcIdentity',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('issuer', models.CharField(help_text="The provider's issuer identifier (the ID token's iss).", max_length=255)),
                ('subject', models.CharField(help_text="The user's id at the provider (the ID token's sub).", max_length=255)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('last_login_at', models.DateTimeField(blank=True, help_text='The last sign-in through the provider.', null=True)),
                ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='oidc_identity', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'OIDC identity',
                'verbose_name_plural': 'OIDC identities',
                'constraints': [models.UniqueConstraint(fields=('issuer', 'subject'), name='oidcidentity_unique_subject')],
            },
        ),
    ]
