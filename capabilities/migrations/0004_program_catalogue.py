"""The operator catalogue (issue 23, C1/C2): tenants no longer write command lines.

Stdio MCP servers and CLI commands now come from ``ProgramTemplate`` rows that only platform
operators publish. Existing rows had tenant-written commands: they are kept but disabled (an
operator publishes the program as a template, and the tenant admin picks it), and their
command columns are dropped, with ``unsandboxed`` and ``allow_network``.
"""

import capabilities.catalogue
from django.db import migrations, models
import django.core.validators
import django.db.models.deletion

DISABLE_SQL = [
    "UPDATE capabilities_mcpserver SET enabled = false, last_error = "
    "'Disabled by the upgrade to the operator catalogue: stdio servers are now programs an operator "
    "publishes as templates; pick one and enable the server again.' WHERE transport = 'stdio'",
    "UPDATE capabilities_clicommand SET enabled = false",
]


class Migration(migrations.Migration):

    dependencies = [
        ("capabilities", "0002_mcp_pool"),
        ("tenants", "0002_max_concurrent_runs"),
    ]

    operations = [
        migrations.CreateModel(
            name="ProgramTemplate",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("slug", models.SlugField(max_length=64, unique=True)),
                ("name", models.CharField(max_length=100)),
                ("description", models.TextField(blank=True, help_text="What tenant admins read when they pick it.")),
                ("kind", models.CharField(choices=[("mcp_stdio", "MCP server (stdio)"), ("cli", "CLI command")], max_length=16)),
                ("argv", models.JSONField(default=list, help_text='JSON list of strings: the program and its arguments, e.g. ["${PYTHON}", "-m", "mcp_server_time"]. ${NAME}: a tenant parameter; {name}: a model argument (CLI only).')),
                ("tenant_parameters", models.JSONField(blank=True, default=list, help_text='Parameters a tenant fills in: [{"name": "TIMEZONE", "description": "...", "default": "UTC", "pattern": "[A-Za-z_/+-]{1,64}", "required": false}].')),
                ("secrets", models.JSONField(blank=True, default=list, help_text='Environment variables a tenant fills in as secrets (stored encrypted), e.g. ["API_TOKEN"].')),
                ("env", models.JSONField(blank=True, default=dict, help_text="Fixed environment variables (not secret).")),
                ("network", models.CharField(choices=[("none", "No network"), ("egress", "Public internet through the egress proxy")], default="none", max_length=8)),
                ("ro_binds", models.JSONField(blank=True, default=list, help_text="Extra host paths visible read-only in the sandbox (besides /usr and SANDBOX_RO_BINDS).")),
                ("parameters_schema", models.JSONField(blank=True, default=capabilities.catalogue._default_schema, help_text="CLI only: JSON Schema of the model's arguments.")),
                ("timeout_seconds", models.FloatField(default=30.0, help_text="CLI: the longest a call may run; MCP: the longest a tool call may take.")),
                ("max_output_bytes", models.PositiveIntegerField(default=65536, help_text="CLI: kept of stdout and of stderr.")),
                ("enabled", models.BooleanField(default=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                ("tenants", models.ManyToManyField(blank=True, help_text="Tenants that may use it; none selected: every tenant.", related_name="+", to="tenants.tenant")),
            ],
            options={"verbose_name": "program template", "ordering": ["name"]},
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="template",
            field=models.ForeignKey(blank=True, help_text="stdio: the program, from the operator's catalogue.", limit_choices_to={"enabled": True, "kind": "mcp_stdio"}, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+", to="capabilities.programtemplate"),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="parameters",
            field=models.JSONField(blank=True, default=dict, help_text="stdio: values of the template's tenant parameters."),
        ),
        migrations.AddField(
            model_name="clicommand",
            name="template",
            field=models.ForeignKey(blank=True, help_text="The program, from the operator's catalogue.", limit_choices_to={"enabled": True, "kind": "cli"}, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+", to="capabilities.programtemplate"),
        ),
        migrations.AddField(
            model_name="clicommand",
            name="parameters",
            field=models.JSONField(blank=True, default=dict, help_text="Values of the template's tenant parameters."),
        ),
        migrations.RunSQL(DISABLE_SQL, reverse_sql=migrations.RunSQL.noop),
        migrations.RemoveField(model_name="mcpserver", name="command"),
        migrations.RemoveField(model_name="mcpserver", name="args"),
        migrations.RemoveField(model_name="clicommand", name="argv_template"),
        migrations.RemoveField(model_name="clicommand", name="parameters_schema"),
        migrations.RemoveField(model_name="clicommand", name="allow_network"),
        migrations.RemoveField(model_name="clicommand", name="unsandboxed"),
        migrations.AlterField(
            model_name="clicommand",
            name="description",
            field=models.TextField(blank=True, help_text="What the model reads: what the command does and when to call it (blank: the template's)."),
        ),
        migrations.AlterField(
            model_name="clicommand",
            name="timeout_seconds",
            field=models.FloatField(default=30.0, help_text="Killed (with its children) after this long; at most the template's limit.", validators=[django.core.validators.MinValueValidator(0.1), django.core.validators.MaxValueValidator(3600)]),
        ),
        migrations.AlterField(
            model_name="clicommand",
            name="max_output_bytes",
            field=models.PositiveIntegerField(default=65536, help_text="Kept of stdout and of stderr, each; the rest is cut with a marker. At most the template's.", validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(16777216)]),
        ),
    ]
