from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0003_action_privacy_unsent"),
    ]

    operations = [
        migrations.AddField(
            model_name="roundaction",
            name="recheck_s",
            field=models.FloatField(
                help_text="waiting: not re-run sooner than this after the last run", null=True
            ),
        ),
        migrations.AddField(
            model_name="roundaction",
            name="scored",
            field=models.PositiveIntegerField(
                default=0, help_text="score: updates scored so far (as they came)"
            ),
        ),
        migrations.AddField(
            model_name="membership",
            name="prepared_at",
            field=models.DateTimeField(
                blank=True,
                help_text="when this node had the job's first round ready (driver.warmup)",
                null=True,
            ),
        ),
    ]
