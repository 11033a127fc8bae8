"""Rejected events, and uint64/uint256 chain values in lossless columns (Uint256Field)."""

from django.db import migrations, models
from django.db.models import Value
from django.db.models.functions import LPad

import backend.ledger.models

# (model, field) pairs that were integer columns: their values get the fixed-width padding that
# keeps the text order equal to the numeric order.
UINT256_FIELDS = [
    ("job", "job_id"),
    ("job", "join_deadline"),
    ("job", "train_period"),
    ("job", "score_period"),
    ("participant", "dataset_id"),
    ("round", "update_deadline"),
    ("round", "score_deadline"),
    ("update", "samples"),
    ("dataset", "dataset_id"),
    ("dataset", "samples"),
    ("dataset", "privacy_cap"),
    ("dataset", "privacy_spent"),
    ("privacyspend", "job_id"),
    ("privacyspend", "spent"),
]


def pad_existing(apps, schema_editor):
    for model_name, field in UINT256_FIELDS:
        model = apps.get_model("ledger", model_name)
        digits = backend.ledger.models.UINT256_DIGITS
        model.objects.using(schema_editor.connection.alias).update(**{field: LPad(field, digits, Value("0"))})


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="RejectedEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("contract", models.CharField(blank=True, max_length=40)),
                ("address", models.CharField(max_length=42)),
                (
                    "name",
                    models.CharField(
                        blank=True, help_text="the event's name, if it was known", max_length=64
                    ),
                ),
                ("block_number", models.PositiveBigIntegerField(db_index=True)),
                ("tx_hash", models.CharField(max_length=66)),
                ("log_index", models.PositiveIntegerField()),
                ("reason", models.CharField(max_length=500)),
                ("topics", models.JSONField(default=list)),
                (
                    "data",
                    models.TextField(
                        blank=True, help_text="the log's data as 0x-hex, cut at MAX_DATA characters"
                    ),
                ),
                (
                    "data_size",
                    models.PositiveIntegerField(default=0, help_text="the log data's full size in bytes"),
                ),
                ("created", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "ordering": ["block_number", "log_index"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tx_hash", "log_index"), name="ledger_rejected_unique_log"
                    )
                ],
            },
        ),
        *[
            migrations.AlterField(
                model_name=model_name,
                name=field,
                field=backend.ledger.models.Uint256Field(
                    **(
                        {"unique": True}
                        if field in ("job_id", "dataset_id") and model_name in ("job", "dataset")
                        else {}
                    ),
                    **({"default": 0} if field == "privacy_spent" else {}),
                ),
            )
            for model_name, field in UINT256_FIELDS
        ],
        migrations.RunPython(pad_existing, migrations.RunPython.noop),
    ]
