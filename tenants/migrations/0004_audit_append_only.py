"""The audit log is append-only in the database (issue 34).

- ``actor`` and ``tenant`` no longer have a foreign key constraint and Django leaves the events
  alone when a user or tenant is deleted (DO_NOTHING): deleting one used to UPDATE its events
  (SET_NULL), which the trigger below refuses.
- A trigger refuses ``UPDATE`` and ``DELETE`` of a row to every role that is not the table's
  owner or a superuser: the application's role is refused whatever its grants
  (tenants/rls.py also revokes both from it). The owner (migrations, a retention job) may.
"""

from django.conf import settings
from django.db import migrations, models

FORWARD = """
CREATE OR REPLACE FUNCTION tenants_auditevent_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'USAGE') THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    RAISE EXCEPTION 'the audit log is append-only: % on % is refused to role %', TG_OP, TG_TABLE_NAME, current_user
        USING ERRCODE = 'insufficient_privilege';
END
$$;
DROP TRIGGER IF EXISTS auditevent_append_only ON tenants_auditevent;
CREATE TRIGGER auditevent_append_only BEFORE UPDATE OR DELETE ON tenants_auditevent
    FOR EACH ROW EXECUTE FUNCTION tenants_auditevent_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS auditevent_append_only ON tenants_auditevent;
DROP FUNCTION IF EXISTS tenants_auditevent_append_only();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0003_membership_pick_invitations_audit'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='auditevent',
            name='actor',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=models.deletion.DO_NOTHING,
                                    related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='tenant',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=models.deletion.DO_NOTHING,
                                    related_name='+', to='tenants.tenant'),
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
