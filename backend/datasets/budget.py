"""Per-dataset privacy budget: a cap (epsilon, delta) and the epsilon each job spent.

Jobs charge the budget before they train on a dataset (the round driver calls
``charge_budget``); a charge that would pass the cap is refused with
``BudgetExceeded`` and nothing is recorded.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Sum

from backend.api.errors import BudgetExceeded, InvalidInput
from backend.datasets.models import BudgetSpend, Dataset

# Float sums of per-round epsilons drift by ulps; a charge that lands exactly on the cap must pass.
_TOLERANCE = 1e-9


def epsilon_spent(dataset: Dataset) -> float:
    return float(dataset.spends.aggregate(total=Sum("epsilon"))["total"] or 0.0)


def budget_summary(dataset: Dataset) -> dict:
    spent = epsilon_spent(dataset)
    return {
        "epsilon_cap": dataset.epsilon_cap,
        "delta": dataset.delta,
        "epsilon_spent": spent,
        "epsilon_left": max(dataset.epsilon_cap - spent, 0.0),
        "spent_by_jobs": [{"job": s.job, "epsilon": s.epsilon} for s in dataset.spends.order_by("job")],
    }


@transaction.atomic
def charge_budget(dataset: Dataset, job: str, epsilon: float, delta: float) -> BudgetSpend:
    """Add ``epsilon`` spent by ``job``; the job's delta may not exceed the dataset's."""
    if epsilon < 0:
        raise InvalidInput("epsilon spent cannot be negative", field="epsilon")
    if delta > dataset.delta:
        raise BudgetExceeded(f"the job's delta {delta:g} is above the dataset's delta {dataset.delta:g}")
    # Lock the dataset row so that two jobs charging at once cannot both pass the cap.
    locked = Dataset.objects.select_for_update().get(pk=dataset.pk)
    spent = epsilon_spent(locked)
    if spent + epsilon > locked.epsilon_cap + _TOLERANCE:
        raise BudgetExceeded(
            f"job {job} needs epsilon {epsilon:g} but dataset {locked.name!r} has "
            f"{max(locked.epsilon_cap - spent, 0.0):g} of {locked.epsilon_cap:g} left"
        )
    spend, _ = BudgetSpend.objects.get_or_create(dataset=locked, job=str(job), defaults={"epsilon": 0.0})
    spend.epsilon += epsilon
    spend.save(update_fields=["epsilon", "updated"])
    return spend
