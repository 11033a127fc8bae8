"""A revocation rotates the dataset's data key (issue 32: grants that end)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("datasets", "0005_keyed_commitments_and_sources")]

    operations = [
        migrations.AddField(
            model_name="dataset",
            name="key_rotation_requested",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="dataset",
            name="key_rotation_claimed",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="dataset",
            name="retired_reference",
            field=models.CharField(blank=True, max_length=512),
        ),
    ]
