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


@pytest.mark.django_db(transaction=True)
def test_datasets_get_secrets_and_releases_move_to_the_replace_one_convention():
    """0005: a registered dataset keeps its plain content hash as its commitment and its own
    budget (disjoint); update and score releases' multipliers double (std over the per-record
    bound, C and 1/2), DP-SGD's stay."""
    old = _migrate([("datasets", "0004_public_holdout")])
    Dataset = old.get_model("datasets", "Dataset")
    fields = dict(
        format="npz",
        num_samples=100,
        feature_shape=[4],
        num_features=4,
        classes=["a", "b"],
        schema_hash="0" * 64,
        size_bytes=1,
        encrypted_reference="",
        status="registered",
        epsilon_cap=50.0,
        delta=DELTA,
    )
    first = Dataset.objects.create(name="a", content_hash="5" * 64, **fields)
    second = Dataset.objects.create(name="b", content_hash="6" * 64, **fields)
    Release = old.get_model("datasets", "PrivacyRelease")
    for kind, noise in [("dp_sgd", 1.5), ("update_gaussian", 2.0), ("score_count", 7.0)]:
        Release.objects.create(
            dataset=first,
            job="1",
            round=1,
            kind=kind,
            noise_multiplier=noise,
            sample_rate=1.0 if kind != "dp_sgd" else 0.1,
            steps=3,
            delta=DELTA,
            epsilon_after=1.0,
            status="released",
        )
    try:
        new = _migrate([("datasets", "0005_keyed_commitments_and_sources")])
        rows = new.get_model("datasets", "Dataset").objects.order_by("pk")
        assert [(d.commitment, d.disjoint) for d in rows] == [("5" * 64, True), ("6" * 64, True)]
        secrets = [d.secret for d in rows]
        assert all(len(bytes.fromhex(s)) == 32 for s in secrets) and secrets[0] != secrets[1]
        releases = new.get_model("datasets", "PrivacyRelease").objects.order_by("id")
        assert [(r.kind, r.noise_multiplier) for r in releases] == [
            ("dp_sgd", 1.5),
            ("update_gaussian", 4.0),
            ("score_count", 14.0),
        ]
        assert first.pk != second.pk
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
