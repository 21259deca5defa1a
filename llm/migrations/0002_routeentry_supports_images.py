from django.db import migrations, models


class Migration(migrations.Migration):
    """Route entries say whether their model takes image input (issue 25: images to models
    that take them)."""

    dependencies = [("llm", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="modelrouteentry",
            name="supports_images",
            field=models.BooleanField(
                default=False,
                help_text="Whether the model takes image input: images attached in the chat are then sent to it "
                          "(PNG, JPEG, GIF, WebP); otherwise it reads a text reference to each.",
            ),
        ),
    ]
