"""The cached RDP accounting equals the full recomputation, and the budget stays strict.

fl_node.privacy composes cached one-step replace-one RDP curves instead of integrating every
history entry on every check; the figures must be the uncached composition, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from backend.api.errors import BudgetExceeded
from backend.datasets import budget
from backend.datasets.models import Dataset, PrivacyRelease
from fl_node.privacy import BudgetLedger, PrivacyHistory, rdp_epsilon, rdp_to_epsilon, replace_one_rdp
from tests.builders import stored_dataset

DELTA = 1e-5
RUNS = [  # (noise, sample rate, steps): repeated mechanisms merge, others append
    (1.1, 64 / 576, 9),
    (1.1, 64 / 576, 9),
    (0.9, 0.05, 40),
    (1.1, 64 / 576, 9),
    (2.5, 1.0, 1),
    (0.7, 0.01, 300),
]


def _history(runs) -> PrivacyHistory:
    history = PrivacyHistory()
    for noise, rate, steps in runs:
        history.record(noise_multiplier=noise, sample_rate=rate, steps=steps)
    return history


@pytest.mark.parametrize("length", range(len(RUNS) + 1))
def test_cached_rdp_is_the_uncached_composition_bit_for_bit(length):
    history = _history(RUNS[:length])
    expected = 0.0
    if length:
        curve = sum(
            (steps * replace_one_rdp(noise, rate) for noise, rate, steps in history.as_tuples()), np.zeros(1)
        )
        expected = rdp_to_epsilon(curve, delta=DELTA)[0]
    assert rdp_epsilon(history, delta=DELTA) == expected


def _combined(dataset: Dataset) -> PrivacyHistory:
    """The dataset's whole history, composed from scratch as the uncached code does."""
    combined = PrivacyHistory()
    for release in PrivacyRelease.objects.filter(dataset=dataset).order_by("id"):
        combined.record(
            noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate, steps=release.steps
        )
    return combined


@pytest.mark.django_db
def test_charges_across_jobs_and_writers_equal_the_full_recomputation():
    dataset = stored_dataset("accounting", num_samples=10, epsilon_cap=50.0, delta=DELTA)
    for i, (noise, rate, steps) in enumerate(RUNS):
        if i == 3:
            # Another process of the node (a Celery worker) wrote a spend: the next charge sees it.
            PrivacyRelease.objects.create(
                dataset=dataset,
                job="99",
                round=4,
                kind="dp_sgd",
                noise_multiplier=1.3,
                sample_rate=0.2,
                steps=11,
                delta=DELTA,
                epsilon_after=0.0,
                status="released",
            )
        full = BudgetLedger(epsilon_cap=50.0, delta=DELTA, history=_combined(dataset))
        expected = full.check(noise_multiplier=noise, sample_rate=rate, steps=steps)
        charge = budget.reserve_budget(
            dataset, str(i % 2), noise_multiplier=noise, sample_rate=rate, steps=steps
        )
        assert charge.epsilon == expected
        assert budget.budget_ledger(dataset).spent() == rdp_epsilon(_combined(dataset), delta=DELTA)
        assert not charge.onchain  # not registered on chain: nothing to send
    summary = budget.budget_summary(dataset)
    assert summary["epsilon_spent"] == rdp_epsilon(_combined(dataset), delta=DELTA)
    for row in summary["spent_by_jobs"]:
        own = _history(
            (r.noise_multiplier, r.sample_rate, r.steps) for r in dataset.releases.filter(job=row["job"])
        )
        assert row["epsilon"] == rdp_epsilon(own, delta=DELTA)
        assert budget.job_epsilon(dataset, row["job"]) == row["epsilon"]


@pytest.mark.django_db
def test_an_over_budget_run_is_refused_before_anything_is_recorded():
    dataset = stored_dataset("accounting", num_samples=10, epsilon_cap=4.0, delta=DELTA)
    budget.reserve_budget(dataset, "1", noise_multiplier=1.1, sample_rate=64 / 576, steps=9)
    before = list(dataset.releases.values_list("job", "noise_multiplier", "steps", "status"))
    with pytest.raises(BudgetExceeded, match="privacy budget exceeded"):
        budget.reserve_budget(dataset, "1", noise_multiplier=0.7, sample_rate=0.01, steps=300)
    assert list(dataset.releases.values_list("job", "noise_multiplier", "steps", "status")) == before
    assert budget.send_spend(budget.Charge(1.0, "", "1", 5)).result() is None  # nothing on chain to send
