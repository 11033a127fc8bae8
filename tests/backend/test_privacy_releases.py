"""Per-round privacy releases: reserved releases count at once, settle once, and compose honestly."""

from __future__ import annotations

import pytest

from backend.api.errors import BudgetExceeded, InvalidInput
from backend.datasets import budget
from backend.datasets.models import PrivacyRelease
from fl_node.privacy import PrivacyHistory, ReleasePlan, rdp_epsilon
from tests.builders import stored_dataset

pytestmark = pytest.mark.django_db

DELTA = 1e-5
TRAIN = ReleasePlan("dp_sgd", noise_multiplier=1.1, sample_rate=0.05, steps=60)
SCORES = ReleasePlan("score_count", noise_multiplier=8.0, sample_rate=1.0, steps=3)


def _epsilon(*plans: ReleasePlan) -> float:
    history = PrivacyHistory()
    for plan in plans:
        history.record(noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate, steps=plan.steps)
    return rdp_epsilon(history, delta=DELTA)


def test_a_reservation_counts_at_once_and_is_shown_apart_until_it_settles():
    dataset = stored_dataset(delta=DELTA)
    charge = budget.reserve_release(dataset, 7, 1, TRAIN)
    assert charge.epsilon == pytest.approx(_epsilon(TRAIN))
    assert charge.job == "7" and charge.round == 1 and charge.micro_epsilon >= charge.epsilon * 1e6
    summary = budget.budget_summary(dataset)
    assert summary["epsilon_spent"] == 0.0
    assert summary["epsilon_reserved"] == pytest.approx(_epsilon(TRAIN))
    assert summary["epsilon_left"] == pytest.approx(20.0 - _epsilon(TRAIN))

    budget.mark_released(dataset, 7, 1, "dp_sgd")
    summary = budget.budget_summary(dataset)
    assert summary["epsilon_spent"] == pytest.approx(_epsilon(TRAIN))
    assert summary["epsilon_reserved"] == 0.0
    assert summary["spent_by_jobs"] == [{"job": "7", "epsilon": pytest.approx(_epsilon(TRAIN)), "rounds": 1}]


def test_reservations_are_checked_together_against_the_cap():
    alone = _epsilon(TRAIN)
    dataset = stored_dataset(
        delta=DELTA, epsilon_cap=(alone + _epsilon(TRAIN, TRAIN)) / 2
    )  # room for one, not two
    budget.reserve_release(dataset, 1, 1, TRAIN)  # reserved, never settled
    with pytest.raises(BudgetExceeded, match="privacy budget exceeded"):
        budget.reserve_release(dataset, 2, 1, TRAIN)
    assert PrivacyRelease.objects.count() == 1


def test_withheld_stays_counted_and_scores_compose_with_training():
    dataset = stored_dataset(delta=DELTA)
    budget.reserve_release(dataset, 3, 1, TRAIN)
    budget.mark_withheld(dataset, 3, 1, "dp_sgd")  # a discarded speculative update
    budget.reserve_release(dataset, 3, 1, TRAIN)  # the retrain: fresh noise, charged again
    budget.mark_released(dataset, 3, 1, "dp_sgd")
    charge = budget.reserve_release(dataset, 3, 2, SCORES)
    budget.mark_released(dataset, 3, 2, "score_count")
    expected = _epsilon(TRAIN, TRAIN, SCORES)
    assert charge.epsilon == pytest.approx(expected)
    assert budget.budget_summary(dataset)["epsilon_spent"] == pytest.approx(expected)
    statuses = list(dataset.releases.order_by("id").values_list("round", "kind", "status"))
    assert statuses == [(1, "dp_sgd", "withheld"), (1, "dp_sgd", "released"), (2, "score_count", "released")]
    # Each record states the composed epsilon once it counted, at the budget's delta.
    afters = list(dataset.releases.order_by("id").values_list("epsilon_after", flat=True))
    assert afters == pytest.approx([_epsilon(TRAIN), _epsilon(TRAIN, TRAIN), expected])
    assert set(dataset.releases.values_list("delta", flat=True)) == {DELTA}


def test_settling_is_idempotent_but_never_reopens_or_unpublishes():
    dataset = stored_dataset(delta=DELTA)
    budget.reserve_release(dataset, 4, 1, TRAIN)
    first = budget.mark_released(dataset, 4, 1, "dp_sgd")
    assert budget.mark_released(dataset, 4, 1, "dp_sgd").pk == first.pk  # a retried action
    with pytest.raises(budget.ReleaseNotReserved):
        budget.mark_withheld(dataset, 4, 1, "dp_sgd")  # published: cannot become unpublished
    with pytest.raises(budget.ReleaseNotReserved):
        budget.mark_released(dataset, 4, 2, "dp_sgd")  # never reserved
    assert dataset.releases.get().status == "released"


@pytest.mark.parametrize("round_", [-1, 2**31, "1", 1.5, True])
def test_a_bad_round_is_refused(round_):
    dataset = stored_dataset(delta=DELTA)
    with pytest.raises(InvalidInput):
        budget.reserve_release(dataset, 1, round_, TRAIN)
    assert not dataset.releases.exists()


def test_a_job_id_or_a_step_count_past_the_columns_is_refused():
    dataset = stored_dataset(delta=DELTA)
    with pytest.raises(InvalidInput):
        budget.reserve_release(dataset, "9" * 81, 1, TRAIN)
    with pytest.raises(InvalidInput):
        budget.reserve_release(dataset, 1, 1, ReleasePlan("dp_sgd", 1e9, 0.01, 2**31))
    assert not dataset.releases.exists()


def test_only_a_release_plan_is_charged():
    dataset = stored_dataset(delta=DELTA)
    with pytest.raises(InvalidInput, match="ReleasePlan"):
        budget.reserve_release(dataset, 1, 1, {"kind": "dp_sgd", "noise_multiplier": 0.0001})
    with pytest.raises(InvalidInput):
        budget.reserve_budget(dataset, 1, noise_multiplier=-1.0, sample_rate=0.1, steps=1)
    assert not dataset.releases.exists()


def test_the_round_less_calls_record_released_releases():
    dataset = stored_dataset(delta=DELTA)
    charge = budget.reserve_budget(dataset, 9, noise_multiplier=2.0, sample_rate=1.0, steps=1)
    release = dataset.releases.get()
    assert (release.kind, release.round, release.status) == ("update_gaussian", None, "released")
    assert budget.budget_summary(dataset)["epsilon_spent"] == pytest.approx(charge.epsilon)
    assert budget.job_epsilon(dataset, 9) == pytest.approx(charge.epsilon)


def test_the_job_figures_separate_spent_from_reserved():
    dataset = stored_dataset(delta=DELTA)
    budget.reserve_release(dataset, 5, 1, TRAIN)
    budget.mark_released(dataset, 5, 1, "dp_sgd")
    budget.reserve_release(dataset, 5, 2, TRAIN)
    spend = budget.job_spend(dataset, 5)
    assert spend.spent == pytest.approx(_epsilon(TRAIN))
    assert spend.total == pytest.approx(_epsilon(TRAIN, TRAIN))
    assert budget.job_epsilon(dataset, 5) == pytest.approx(_epsilon(TRAIN))


def test_lost_attempts_are_withheld_and_stay_counted_before_a_new_one_is_reserved():
    dataset = stored_dataset(delta=DELTA)
    for _ in range(3):  # three attempts of round 1 reserved, none settled (restarts)
        budget.reserve_release(dataset, 9, 1, TRAIN)
    budget.reserve_release(dataset, 9, 2, TRAIN)  # another round: not an attempt of round 1
    budget.reserve_release(dataset, 9, 1, SCORES)  # another kind: not an attempt of the training release
    assert budget.withhold_abandoned(dataset, 9, 1, "dp_sgd") == 3
    assert budget.withhold_abandoned(dataset, 9, 1, "dp_sgd") == 0  # nothing left open
    statuses = sorted(PrivacyRelease.objects.filter(dataset=dataset).values_list("round", "kind", "status"))
    assert statuses == [
        (1, "dp_sgd", "withheld"),
        (1, "dp_sgd", "withheld"),
        (1, "dp_sgd", "withheld"),
        (1, "score_count", "reserved"),
        (2, "dp_sgd", "reserved"),
    ]
    summary = budget.budget_summary(dataset)
    assert summary["epsilon_spent"] == pytest.approx(_epsilon(TRAIN, TRAIN, TRAIN))
    with pytest.raises(InvalidInput):
        budget.withhold_abandoned(dataset, 9, -1, "dp_sgd")


def test_withholding_lost_attempts_is_bounded():
    dataset = stored_dataset(delta=DELTA, epsilon_cap=1e6)
    tiny = ReleasePlan("dp_sgd", noise_multiplier=50.0, sample_rate=0.01, steps=1)
    for _ in range(budget.MAX_ABANDONED + 2):
        budget.reserve_release(dataset, 5, 3, tiny)
    assert budget.withhold_abandoned(dataset, 5, 3, "dp_sgd") == budget.MAX_ABANDONED
    assert budget.withhold_abandoned(dataset, 5, 3, "dp_sgd") == 2
