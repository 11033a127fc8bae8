"""Keyed commitments, budget sources and the replace-one accounting (issue 33).

* Every dataset gets a secret of its own (its commitment's, hold-out's and splits' key). A
  dataset registered before keeps its registered plain content hash as its commitment and is
  marked disjoint: it was registered with a budget of its own.
* Recorded releases move to the replace-one convention of ``fl_node.privacy``: the noise's std
  over the per-record bound. DP-SGD's multiplier (std over C) is unchanged; the update
  mechanism's was std over 2C (now std over C: twice the number) and a score count's was its
  std (now std over 1/2: twice the number). The same releases then compose under replace-one.
"""

import secrets

from django.db import migrations, models
from django.db.models import F

import backend.datasets.commitment


def forwards(apps, schema_editor):
    Dataset = apps.get_model("datasets", "Dataset")
    for dataset in Dataset.objects.all():
        dataset.secret = secrets.token_hex(32)
        dataset.commitment = dataset.content_hash
        dataset.disjoint = True
        dataset.save(update_fields=["secret", "commitment", "disjoint"])
    PrivacyRelease = apps.get_model("datasets", "PrivacyRelease")
    PrivacyRelease.objects.filter(kind__in=("update_gaussian", "score_count")).update(
        noise_multiplier=F("noise_multiplier") * 2
    )


def backwards(apps, schema_editor):
    PrivacyRelease = apps.get_model("datasets", "PrivacyRelease")
    PrivacyRelease.objects.filter(kind__in=("update_gaussian", "score_count")).update(
        noise_multiplier=F("noise_multiplier") / 2
    )


class Migration(migrations.Migration):
    dependencies = [
        ("datasets", "0004_public_holdout"),
    ]

    operations = [
        migrations.AddField(
            model_name="dataset",
            name="secret",
            field=models.CharField(blank=True, default=backend.datasets.commitment.new_secret, max_length=64),
        ),
        migrations.AddField(
            model_name="dataset", name="commitment", field=models.CharField(blank=True, max_length=64)
        ),
        migrations.AddField(model_name="dataset", name="disjoint", field=models.BooleanField(default=False)),
        migrations.AddField(
            model_name="dataset", name="onchain_source", field=models.CharField(blank=True, max_length=80)
        ),
        migrations.AddField(
            model_name="budgetgroup", name="shared", field=models.BooleanField(default=False)
        ),
        migrations.RunPython(forwards, backwards),
    ]
