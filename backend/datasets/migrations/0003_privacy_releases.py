"""Per-release privacy records and budget groups; the per-job BudgetSpend histories move into them.

Each run of a BudgetSpend history becomes one released PrivacyRelease without a round (the
history never knew its rounds), in the order the spends were written, with the epsilon the
dataset's composed history reached after it. Every dataset gets a budget group of its own:
rows uploaded before record hashes existed have none to link them by.
"""

import json
import math

import django.db.models.deletion
from django.db import migrations, models

MICRO_EPSILON = 1_000_000


def spends_to_releases(apps, schema_editor):
    from fl_node.privacy import PrivacyHistory, rdp_epsilon

    Dataset = apps.get_model("datasets", "Dataset")
    BudgetGroup = apps.get_model("datasets", "BudgetGroup")
    BudgetSpend = apps.get_model("datasets", "BudgetSpend")
    PrivacyRelease = apps.get_model("datasets", "PrivacyRelease")
    for dataset in Dataset.objects.order_by("pk"):
        dataset.budget_group = BudgetGroup.objects.create()
        dataset.save(update_fields=["budget_group"])
        composed = PrivacyHistory()
        before = 0.0
        for spend in BudgetSpend.objects.filter(dataset=dataset).order_by("id"):
            for noise, rate, steps in json.loads(spend.history):
                composed.record(noise_multiplier=float(noise), sample_rate=float(rate), steps=int(steps))
                after = rdp_epsilon(composed, delta=dataset.delta)
                PrivacyRelease.objects.create(
                    dataset=dataset,
                    job=spend.job,
                    round=None,
                    kind="update_gaussian" if float(rate) == 1.0 and int(steps) == 1 else "dp_sgd",
                    noise_multiplier=float(noise),
                    sample_rate=float(rate),
                    steps=int(steps),
                    delta=dataset.delta,
                    epsilon_after=after,
                    micro_epsilon=max(math.ceil((after - before) * MICRO_EPSILON), 0),
                    status="released",
                )
                before = after


class Migration(migrations.Migration):
    dependencies = [
        ("datasets", "0002_budget_history"),
    ]

    operations = [
        migrations.CreateModel(
            name="BudgetGroup",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("created", models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.AddField(
            model_name="dataset",
            name="budget_group",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="datasets",
                to="datasets.budgetgroup",
            ),
        ),
        migrations.CreateModel(
            name="PrivacyRelease",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job", models.CharField(max_length=80)),
                ("round", models.PositiveIntegerField(blank=True, null=True)),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("dp_sgd", "Dp Sgd"),
                            ("update_gaussian", "Update Gaussian"),
                            ("score_count", "Score Count"),
                        ],
                        max_length=16,
                    ),
                ),
                (
                    "noise_multiplier",
                    models.FloatField(help_text="noise std / the release's record-level L2 sensitivity"),
                ),
                ("sample_rate", models.FloatField()),
                ("steps", models.PositiveIntegerField()),
                (
                    "delta",
                    models.FloatField(help_text="the delta epsilon_after is stated at (the budget group's)"),
                ),
                ("epsilon_after", models.FloatField()),
                (
                    "micro_epsilon",
                    models.PositiveBigIntegerField(
                        default=0,
                        help_text="the rise of the budget's epsilon, in micro-epsilon (what the chain is told)",
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("reserved", "Reserved"),
                            ("released", "Released"),
                            ("withheld", "Withheld"),
                        ],
                        default="reserved",
                        max_length=10,
                    ),
                ),
                ("created", models.DateTimeField(auto_now_add=True)),
                ("updated", models.DateTimeField(auto_now=True)),
                (
                    "dataset",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="releases",
                        to="datasets.dataset",
                    ),
                ),
            ],
            options={
                "ordering": ["id"],
            },
        ),
        migrations.CreateModel(
            name="RecordHash",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("digest", models.CharField(db_index=True, max_length=32)),
                (
                    "dataset",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="record_hashes",
                        to="datasets.dataset",
                    ),
                ),
            ],
        ),
        migrations.RunPython(spends_to_releases, migrations.RunPython.noop),
        migrations.DeleteModel(
            name="BudgetSpend",
        ),
        migrations.AddIndex(
            model_name="privacyrelease",
            index=models.Index(fields=["job", "round"], name="datasets_pr_job_5fe4ac_idx"),
        ),
        migrations.AddIndex(
            model_name="privacyrelease",
            index=models.Index(fields=["dataset", "status"], name="datasets_pr_dataset_99ce38_idx"),
        ),
        migrations.AddConstraint(
            model_name="recordhash",
            constraint=models.UniqueConstraint(fields=("dataset", "digest"), name="one_record_hash"),
        ),
    ]
