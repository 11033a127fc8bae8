"""Datasets register a DP count of their records: the true count is kept apart, locally.

Existing rows registered their exact size: ``records`` is that size and ``count_noise_std`` 0,
so their budgets stay accounted under replace-one (backend.datasets.budget)."""

from django.db import migrations, models


def exact_sizes(apps, schema_editor):
    Dataset = apps.get_model("datasets", "Dataset")
    Dataset.objects.filter(records__isnull=True).update(records=models.F("num_samples"))


class Migration(migrations.Migration):
    dependencies = [("datasets", "0006_key_rotation")]

    operations = [
        migrations.AddField(
            model_name="dataset",
            name="records",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="dataset",
            name="count_noise_std",
            field=models.FloatField(default=0.0),
        ),
        migrations.AlterField(
            model_name="privacyrelease",
            name="kind",
            field=models.CharField(
                choices=[
                    ("dp_sgd", "Dp Sgd"),
                    ("update_gaussian", "Update Gaussian"),
                    ("score_count", "Score Count"),
                    ("count", "Count"),
                ],
                max_length=16,
            ),
        ),
        migrations.RunPython(exact_sizes, migrations.RunPython.noop),
    ]
