"""Per-dataset privacy budget: a cap (epsilon, delta) and what each job spent, enforced with RDP.

The accounting is the learning core's (``fl_node.privacy``): every job's mechanism runs
(noise multiplier, sample rate, steps) are composed with the RDP accountant across all
jobs, which is valid for any interleaving and far tighter than adding per-job epsilons.
A job's own epsilon (its history alone) is shown per job.

The round driver charges a run before it trains. ``reserve_budget`` is the strict part: under
the dataset's row lock it refuses (``BudgetExceeded``) a run that would pass the cap and
otherwise records it locally; nothing is trained before it returns. The on-chain record
(DataRegistry.spendPrivacy) may then be sent in the background with ``send_spend`` while the
node trains, as long as the caller waits for it before it releases anything trained on the
data (the trainer waits before submitUpdate). ``charge_budget`` does both in one step.

Cost: ``fl_node.privacy`` caches the one-step RDP curve of each mechanism, so composing a
dataset's whole history on every check costs microseconds.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.db import transaction

from backend.api.errors import BudgetExceeded, InvalidInput
from backend.datasets import chain
from backend.datasets.models import BudgetSpend, Dataset
from backend.nodes import ledger_access
from fl_node.privacy import BudgetLedger, PrivacyBudgetExceeded, PrivacyHistory, rdp_epsilon

logger = logging.getLogger(__name__)

# One thread, so a node's spendPrivacy transactions go out in the order they were charged.
_chain_sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="privacy-spend")


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


def job_epsilon(dataset: Dataset, job: str | int, *, delta: float | None = None) -> float:
    """What ``job`` alone spent on the dataset (its own history, RDP; at the dataset's delta by default)."""
    spend = dataset.spends.filter(job=str(job)).first()
    return rdp_epsilon(_job_history(spend), delta=delta or dataset.delta) if spend else 0.0


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


@dataclass(frozen=True)
class Charge:
    """A run recorded in the local ledger; ``micro_epsilon`` is still to be spent on chain."""

    epsilon: float  # the dataset's epsilon after the run
    onchain_id: str  # "" for a dataset that is not registered on chain
    job: str
    micro_epsilon: int

    @property
    def onchain(self) -> bool:
        return bool(self.onchain_id) and self.micro_epsilon > 0


@transaction.atomic
def reserve_budget(
    dataset: Dataset, job: str | int, *, noise_multiplier: float, sample_rate: float, steps: int
) -> Charge:
    """Check the run against the cap and record it locally; BudgetExceeded records nothing."""
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
    spend, _ = BudgetSpend.objects.get_or_create(dataset=locked, job=str(job), defaults={"history": "[]"})
    history = _job_history(spend)
    history.record(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    spend.history = history.to_json()
    spend.save(update_fields=["history", "updated"])
    increase = max(math.ceil((projected - spent_before) * chain.MICRO_EPSILON), 0)
    return Charge(projected, locked.onchain_id, str(job), increase)


def send_spend(charge: Charge) -> Future:
    """DataRegistry.spendPrivacy of a reserved charge, sent on a background thread.

    The ledger is resolved here, in the caller's thread (tests route it per node). The
    future's result is the transaction hash (None without a ledger or nothing to spend); its
    exception is the chain's (a revert past the chain's cap, the chain unreachable).
    """
    ledger = ledger_access.node_ledger() if charge.onchain else None
    if ledger is None:
        done: Future = Future()
        done.set_result(None)
        return done

    def send() -> str:
        return ledger.data.spend_privacy(
            int(charge.onchain_id), int(charge.job), charge.micro_epsilon
        ).tx_hash

    return _chain_sender.submit(send)


@transaction.atomic
def charge_budget(
    dataset: Dataset, job: str | int, *, noise_multiplier: float, sample_rate: float, steps: int
) -> float:
    """Record a run of ``steps`` DP steps by ``job`` locally and on chain; returns the epsilon after.

    One step: the spendPrivacy transaction is sent and awaited inside the local transaction,
    so if the chain refuses it the local record is rolled back too.
    """
    charge = reserve_budget(
        dataset, job, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps
    )
    if charge.onchain:
        chain.spend_privacy(charge.onchain_id, charge.job, charge.micro_epsilon)
    return charge.epsilon
