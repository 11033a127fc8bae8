from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0002_action_parts"),
    ]

    operations = [
        migrations.AddField(
            model_name="roundaction",
            name="privacy_unsent",
            field=models.PositiveBigIntegerField(
                default=0, help_text="train: micro-epsilon charged locally, not yet spent on chain"
            ),
        ),
    ]
