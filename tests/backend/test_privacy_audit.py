"""Every epsilon the node records holds against Google's dp-accounting (fl_node.privacy_audit).

The releases of two jobs on a budget group of two overlapping datasets (DP-SGD rounds, update
releases at the 2C sensitivity, committee score counts, a withheld retrain) are recorded through
the budget as the round driver records them; then each record's ``epsilon_after`` and the
dataset's shown totals are recomputed independently from the records alone.
"""

from __future__ import annotations

import pytest

from backend.datasets import budget
from backend.datasets.models import BudgetGroup, PrivacyRelease
from fl_node.privacy import PrivacyHistory, ReleasePlan
from fl_node.privacy_audit import assert_claim_holds
from tests.builders import stored_dataset

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # dp-accounting's PLD: a minute on 2 cores

RELEASES = [  # (dataset index, job, round, plan, settle as)
    (0, 1, 1, ReleasePlan("dp_sgd", 1.3, 0.04, 50), "released"),
    (1, 2, 1, ReleasePlan("score_count", 6.0, 1.0, 3), "released"),
    (0, 1, 2, ReleasePlan("dp_sgd", 1.3, 0.04, 50), "withheld"),  # a discarded speculative update
    (0, 1, 2, ReleasePlan("dp_sgd", 1.3, 0.04, 50), "released"),  # its retrain, charged again
    (1, 2, 2, ReleasePlan("update_gaussian", 4.0, 1.0, 1), "released"),
    (0, 1, 3, ReleasePlan("dp_sgd", 1.3, 0.04, 50), None),  # still reserved
]


def _history(releases) -> PrivacyHistory:
    history = PrivacyHistory()
    for release in releases:
        history.record(
            noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate, steps=release.steps
        )
    return history


def test_recorded_epsilons_are_never_below_the_independent_accountant():
    group = BudgetGroup.objects.create()
    members = [
        stored_dataset("alpha", content="a", budget_group=group, epsilon_cap=40.0, delta=1e-4),
        stored_dataset("beta", content="b", budget_group=group, epsilon_cap=40.0, delta=1e-5),
    ]
    for index, job, round_, plan, settle in RELEASES:
        budget.reserve_release(members[index], job, round_, plan)
        if settle == "released":
            budget.mark_released(members[index], job, round_, plan.kind)
        elif settle == "withheld":
            budget.mark_withheld(members[index], job, round_, plan.kind)

    records = list(PrivacyRelease.objects.order_by("id"))
    assert {r.delta for r in records} == {1e-5}  # the group's smallest delta
    for upto, record in enumerate(records, start=1):
        assert_claim_holds(_history(records[:upto]), delta=record.delta, claimed_epsilon=record.epsilon_after)

    shown = budget.budget_summary(members[0])
    counted = [r for r in records if r.status != "reserved"]
    assert_claim_holds(_history(counted), delta=shown["delta"], claimed_epsilon=shown["epsilon_spent"])
    assert_claim_holds(
        _history(records),
        delta=shown["delta"],
        claimed_epsilon=shown["epsilon_spent"] + shown["epsilon_reserved"],
    )
