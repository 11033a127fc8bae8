"""A node restored from a backup older than some of its releases records them again from the chain.

The chain holds every spend (PrivacySpent, mirrored with kind and steps); the restored database
lacks the releases made after the backup. The agent's reconcile (backend/jobs/driver/reconcile.py)
records each missing one from the job's public plan, without the cap check, so the budget counts
it and a later release that no longer fits is refused; releases the database still has are not
recorded twice, and a job whose configuration cannot be read yet is left for a later pass.
"""

from __future__ import annotations

import pytest

from backend.api.errors import BudgetExceeded
from backend.datasets import budget
from backend.datasets.models import PrivacyRelease
from backend.jobs import chain
from backend.jobs.driver.privacy import node_plan
from backend.jobs.driver.reconcile import Reconciled, reconcile_releases
from backend.jobs.models import JobRecord
from backend.ledger import models as mirror
from backend.ledger.resources import JobSpec, SpendKind
from fl_node.job.config import DPConfig
from fl_node.privacy import PrivacyHistory, rdp_epsilon
from fl_node.privacy_plan import spend_release
from tests.builders import job_config, stored_dataset
from tests.jobs.jobs_helpers import draw_committee, make_nodes

pytestmark = pytest.mark.django_db
CONFIG = job_config(
    dp=DPConfig(mode="sgd", target_epsilon=8.0, delta=1e-5, max_grad_norm=1.0),
    committee_size=1,
    top_k=1,
    min_trainers=1,
)


def _running_job(nodes, config_hash: bytes) -> int:
    fl = nodes[0].ctx.ledger.fl
    now = fl.client.w3.eth.get_block("latest")["timestamp"]
    spec = JobSpec(
        config_hash,
        b"\x11" * 32,
        b"\x22" * 32,
        2,
        1,
        1,
        1,
        now + 3600,
        600,
        600,
        max_spend_per_round=5_000_000,
    )
    job = fl.propose_job(spec)
    for i, node in enumerate(nodes):
        node.ctx.ledger.fl.join(job, i + 1)
    fl.start_job(job)
    draw_committee(nodes, job)
    return job


def test_a_restored_node_records_the_releases_the_chain_holds_and_its_database_lost():
    nodes = make_nodes(3, "restore-reconcile")
    for i, node in enumerate(nodes):
        node.ctx.ledger.data.register_dataset(
            bytes([i + 1]) * 32, bytes([i + 9]) * 32, b"\x05" * 32, 1000, 20_000_000
        )
    job = _running_job(nodes, b"\x01" * 32)
    committee = set(nodes[0].ctx.ledger.fl.committee(job))
    me_index = next(i for i, node in enumerate(nodes) if node.ctx.address not in committee)  # a trainer
    me = nodes[me_index].ctx
    dataset = stored_dataset("mine", num_samples=1000, epsilon_cap=50.0, onchain_id=str(me_index + 1))
    JobRecord.objects.create(
        onchain_id=job,
        name="dp",
        config=CONFIG.as_dict(),
        config_hash="0x" + "01" * 32,
        initial_model_ref="0x" + "11" * 32,
        initial_model_hash="0x" + "22" * 32,
        proposer=nodes[0].ctx.address,
    )
    chain.sync_mirror(me)
    plan = node_plan(me, mirror.Job.objects.get(job_id=job), CONFIG, dataset)
    assert plan.train is not None and plan.train.kind == "dp_sgd"
    first = spend_release(plan, 2, 7)  # a speculative update, withheld: 7 local steps
    second = spend_release(plan, 0, 11)  # the update it published: 11 steps

    # Before the backup: the first release was reserved (and withheld) here and went on chain.
    budget.reserve_release(dataset, job, 1, first)
    budget.mark_withheld(dataset, job, 1, first.kind)
    me.ledger.fl.spend_privacy(job, 1, 300_000, SpendKind.WITHHELD, 7)
    # After it (lost with the restore): the second went on chain, its local record did not survive.
    me.ledger.fl.spend_privacy(job, 1, 400_000, SpendKind.UPDATE, 11)
    chain.sync_mirror(me)

    assert reconcile_releases(me) == Reconciled(recorded=1, pending=0)
    rows = list(PrivacyRelease.objects.filter(dataset=dataset).order_by("id"))
    assert [(r.round, r.kind, r.steps, r.status, r.micro_epsilon) for r in rows[1:]] == [
        (1, "dp_sgd", 11, PrivacyRelease.Status.RELEASED, 400_000)
    ]
    assert rows[0].status == PrivacyRelease.Status.WITHHELD and rows[0].steps == 7
    assert reconcile_releases(me) == Reconciled(recorded=0, pending=0)  # nothing recorded twice

    # The budget counts it: a release that fits beside the first alone no longer fits beside both.
    def composed(*releases) -> float:
        history = PrivacyHistory()
        for r in releases:
            history.record(noise_multiplier=r.noise_multiplier, sample_rate=r.sample_rate, steps=r.steps)
        return rdp_epsilon(history, delta=dataset.delta)

    assert budget.budget_summary(dataset)["epsilon_spent"] == pytest.approx(composed(first, second))
    without, with_both = composed(first, first), composed(first, second, first)
    dataset.epsilon_cap = (without + with_both) / 2
    dataset.save(update_fields=["epsilon_cap"])
    with pytest.raises(BudgetExceeded):
        budget.reserve_release(dataset, job, 2, first)


def test_a_job_whose_configuration_is_not_readable_yet_is_left_for_a_later_pass():
    nodes = make_nodes(3, "restore-reconcile-pending")
    for i, node in enumerate(nodes):
        node.ctx.ledger.data.register_dataset(
            bytes([i + 1]) * 32, bytes([i + 9]) * 32, b"\x05" * 32, 1000, 20_000_000
        )
    job = _running_job(nodes, b"\x0f" * 32)  # no node holds this configuration
    committee = set(nodes[0].ctx.ledger.fl.committee(job))
    me_index = next(i for i, node in enumerate(nodes) if node.ctx.address not in committee)
    me = nodes[me_index].ctx
    dataset = stored_dataset("mine", num_samples=1000, onchain_id=str(me_index + 1))
    me.ledger.fl.spend_privacy(job, 1, 400_000, SpendKind.UPDATE, 11)
    chain.sync_mirror(me)
    assert reconcile_releases(me) == Reconciled(recorded=0, pending=1)
    assert not PrivacyRelease.objects.filter(dataset=dataset).exists()
