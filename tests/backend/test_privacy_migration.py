"""The BudgetSpend histories move into per-release records with the same composed epsilon."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from fl_node.privacy import PrivacyHistory, rdp_epsilon

BEFORE = [("datasets", "0002_budget_history")]
AFTER = [("datasets", "0003_privacy_releases")]
DELTA = 1e-5
HISTORIES = {"1": [[1.1, 0.05, 60], [1.1, 0.05, 60]], "2": [[2.0, 1.0, 1]]}


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_spends_become_released_releases_and_each_dataset_a_budget_group():
    import json

    old = _migrate(BEFORE)
    Dataset = old.get_model("datasets", "Dataset")
    dataset = Dataset.objects.create(
        name="old",
        format="npz",
        num_samples=100,
        feature_shape=[4],
        num_features=4,
        classes=["a", "b"],
        schema_hash="0" * 64,
        content_hash="3" * 64,
        size_bytes=1,
        encrypted_reference="",
        status="stored",
        epsilon_cap=50.0,
        delta=DELTA,
    )
    untouched = Dataset.objects.create(
        **{f.name: getattr(dataset, f.name) for f in Dataset._meta.fields if f.name not in ("id", "created")}
        | {"content_hash": "4" * 64}
    )
    for job, history in HISTORIES.items():
        old.get_model("datasets", "BudgetSpend").objects.create(
            dataset=dataset, job=job, history=json.dumps(history)
        )

    try:
        new = _migrate(AFTER)
        releases = list(
            new.get_model("datasets", "PrivacyRelease").objects.filter(dataset_id=dataset.pk).order_by("id")
        )
        assert [(r.job, r.kind, r.round, r.status, r.steps) for r in releases] == [
            ("1", "dp_sgd", None, "released", 60),
            ("1", "dp_sgd", None, "released", 60),
            ("2", "update_gaussian", None, "released", 1),
        ]
        composed = PrivacyHistory()
        for history in HISTORIES.values():
            for noise, rate, steps in history:
                composed.record(noise_multiplier=noise, sample_rate=rate, steps=steps)
        assert releases[-1].epsilon_after == pytest.approx(rdp_epsilon(composed, delta=DELTA))
        assert releases[0].epsilon_after < releases[1].epsilon_after < releases[2].epsilon_after
        datasets = new.get_model("datasets", "Dataset").objects
        groups = {d.budget_group_id for d in datasets.filter(pk__in=[dataset.pk, untouched.pk])}
        assert len(groups) == 2 and None not in groups
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
