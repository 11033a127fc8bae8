"""Per-dataset privacy budget: a cap (epsilon, delta) and what each job spent, enforced with RDP.

The accounting is the learning core's (``fl_node.privacy.BudgetLedger``): every
job's mechanism runs (noise multiplier, sample rate, steps) are composed with the
RDP accountant across all jobs, which is valid for any interleaving and far
tighter than adding per-job epsilons. A job's own epsilon (its history alone) is
shown per job. The round driver calls ``charge_budget`` before it trains; a run
that would pass the cap is refused with ``BudgetExceeded`` and nothing is
recorded, locally or on chain.
"""

from __future__ import annotations

import math

from django.db import transaction

from backend.api.errors import BudgetExceeded, InvalidInput
from backend.datasets import chain
from backend.datasets.models import BudgetSpend, Dataset
from fl_node.privacy import BudgetLedger, PrivacyBudgetExceeded, PrivacyHistory, rdp_epsilon


def _job_history(spend: BudgetSpend) -> PrivacyHistory:
    return PrivacyHistory.from_json(spend.history)


def budget_ledger(dataset: Dataset) -> BudgetLedger:
    """The dataset's cap and the composed history of every job that trained on it."""
    combined = PrivacyHistory()
    for spend in dataset.spends.order_by("id"):
        for entry in _job_history(spend):
            combined.record(
                noise_multiplier=entry.noise_multiplier, sample_rate=entry.sample_rate, steps=entry.steps
            )
    return BudgetLedger(epsilon_cap=dataset.epsilon_cap, delta=dataset.delta, history=combined)


def budget_summary(dataset: Dataset) -> dict:
    ledger = budget_ledger(dataset)
    spent = ledger.spent()
    return {
        "epsilon_cap": dataset.epsilon_cap,
        "delta": dataset.delta,
        "epsilon_spent": spent,
        "epsilon_left": max(dataset.epsilon_cap - spent, 0.0),
        "spent_by_jobs": [
            {"job": spend.job, "epsilon": rdp_epsilon(_job_history(spend), delta=dataset.delta)}
            for spend in dataset.spends.order_by("job")
        ],
    }


@transaction.atomic
def charge_budget(
    dataset: Dataset, job: str | int, *, noise_multiplier: float, sample_rate: float, steps: int
) -> float:
    """Record a run of ``steps`` DP steps by ``job``; returns the dataset's epsilon afterwards.

    On chain (a registered dataset), DataRegistry.spendPrivacy records the increase
    in micro-epsilon, so the chain's cap and this node's agree; the chain call
    happens under the dataset's row lock, before the local record is written.
    """
    # Lock the row: two jobs charging at once must not both pass the cap.
    locked = Dataset.objects.select_for_update().get(pk=dataset.pk)
    ledger = budget_ledger(locked)
    spent_before = ledger.spent()
    try:
        projected = ledger.check(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    except PrivacyBudgetExceeded as exc:
        raise BudgetExceeded(f"dataset {locked.name!r}: {exc}") from exc
    except ValueError as exc:  # a mechanism the accountant rejects (negative noise, rate > 1, ...)
        raise InvalidInput(str(exc)) from exc
    if locked.onchain_id:
        increase = max(math.ceil((projected - spent_before) * chain.MICRO_EPSILON), 0)
        chain.spend_privacy(locked.onchain_id, job, increase)
    spend, _ = BudgetSpend.objects.get_or_create(dataset=locked, job=str(job), defaults={"history": "[]"})
    history = _job_history(spend)
    history.record(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    spend.history = history.to_json()
    spend.save(update_fields=["history", "updated"])
    return projected
