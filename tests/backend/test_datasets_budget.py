"""Privacy budget: RDP-composed spend per dataset, per-job figures, refusal past the cap."""

from __future__ import annotations

import pytest
from dataset_files import form, good_npz

from backend.api.errors import BudgetExceeded
from backend.datasets.budget import budget_summary, charge_budget
from backend.datasets.models import Dataset
from backend.ledger.errors import ContractRevert
from fl_node.dp_count import count_release
from fl_node.privacy import ADD_REMOVE, rdp_epsilon

pytestmark = pytest.mark.django_db

RUN = {"noise_multiplier": 1.1, "sample_rate": 0.01, "steps": 200}
# Every upload registers a DP count of its records: its first release (fl_node.dp_count).
COUNT_EPSILON = rdp_epsilon(count_release().history(), delta=1e-5, adjacency=ADD_REMOVE)


def _dataset(client, epsilon_cap: float) -> Dataset:
    assert client.post("/api/datasets", form(good_npz(), "npz", epsilon_cap=epsilon_cap)).status_code == 201
    return Dataset.objects.get()


def test_spend_is_composed_across_jobs_and_shown_per_job(provider):
    dataset = _dataset(provider, epsilon_cap=10.0)
    after_first = charge_budget(dataset, "1", **RUN)
    after_second = charge_budget(dataset, "2", **RUN)
    summary = budget_summary(dataset)
    assert summary["epsilon_spent"] == pytest.approx(after_second)
    per_job = {row["job"]: row["epsilon"] for row in summary["spent_by_jobs"]}
    assert per_job["registration"] == pytest.approx(COUNT_EPSILON)
    # RDP composition: the count and a job together cost less than the sum of their epsilons, and
    # two jobs less than twice one.
    assert per_job["1"] < after_first < per_job["1"] + COUNT_EPSILON
    assert after_first < after_second < 2 * after_first
    assert summary["epsilon_left"] == pytest.approx(10.0 - after_second)
    assert provider.get(f"/api/datasets/{dataset.pk}").json()["budget"]["epsilon_spent"] == pytest.approx(
        after_second
    )


def test_charge_past_the_cap_is_refused_and_records_nothing(provider):
    dataset = _dataset(provider, epsilon_cap=0.5)
    with pytest.raises(BudgetExceeded, match="privacy budget exceeded"):
        charge_budget(dataset, "7", **RUN)
    assert budget_summary(dataset)["epsilon_spent"] == pytest.approx(COUNT_EPSILON)
    assert list(dataset.releases.values_list("kind", flat=True)) == ["count"]


def test_a_spend_the_chain_refuses_rolls_the_local_record_back(provider, on_chain):
    # The chain records spends only for a job's participants: job 3 does not exist there, so
    # the spendPrivacy transaction reverts, and charge_budget's local record goes with it.
    dataset = _dataset(provider, epsilon_cap=10.0)
    with pytest.raises(ContractRevert):
        charge_budget(dataset, "3", **RUN)
    assert list(dataset.releases.values_list("kind", flat=True)) == ["count"]
    assert budget_summary(dataset)["epsilon_spent"] == pytest.approx(COUNT_EPSILON)
