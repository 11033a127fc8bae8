"""A node's mirror when it moves to the new contracts file after an upgrade.

The node's database holds what it mirrored of the previous contracts (their datasets had no budget
source; a job). Pointed at the new deployment, its indexer reads the import's events: the
members, each carried dataset joined to the source the new contracts gave it with the spend
carried over, and what the old job spent since.
"""

from __future__ import annotations

import pytest

from backend.ledger import models as mirror
from backend.ledger.indexer import EventIndexer
from tests.upgrade.contract_upgrade import MEMBERS, carry_over, read_old_state, spend_on_old_job

pytestmark = pytest.mark.django_db


def _old_mirror(state, job: int, proposer: str) -> None:
    """The rows an old node's indexer left: datasets without a source, the old job."""
    for dataset_id, (owner, samples, cap, spent, commitment) in state.datasets.items():
        mirror.Dataset.objects.create(
            dataset_id=dataset_id,
            owner=owner,
            commitment="0x" + commitment.hex(),
            swarm_ref="0x" + commitment.hex(),
            schema_hash="0x" + commitment.hex(),
            samples=samples,
            privacy_cap=cap,
            privacy_spent=spent,
            registered_block=1,
        )
    mirror.Job.objects.create(
        job_id=job,
        proposer=proposer,
        config_hash="0x" + "01" * 32,
        initial_model_ref="0x" + "11" * 32,
        initial_model_hash="0x" + "22" * 32,
        rounds=2,
        committee_size=1,
        top_k=1,
        min_trainers=1,
        join_deadline=1,
        train_period=600,
        score_period=600,
        status=mirror.Job.Status.RUNNING,
        current_round=1,
        proposed_block=1,
    )


def test_the_mirror_joins_carried_datasets_to_their_sources_with_the_carried_spend(chain):
    w3, members = chain.w3, chain.ledgers[:MEMBERS]
    before = read_old_state(w3, chain.old)
    _old_mirror(before, chain.job, chain.accounts[0].address)
    carry_over(w3, chain.old, members[0], members)
    spend_on_old_job(w3, chain.old, chain.accounts[2], chain.job, 500)
    members[0].data.sync_spent(3)

    EventIndexer(members[0].client, chain.new, confirmations=0).sync()

    assert sorted(
        mirror.Node.objects.filter(status=mirror.Node.Status.MEMBER).values_list("address", flat=True)
    ) == (sorted(a.address for a in chain.accounts[:MEMBERS]))
    rows = {d.dataset_id: d for d in mirror.Dataset.objects.select_related("source")}
    assert sorted(rows) == [1, 2, 3]
    for dataset_id, (_owner, _samples, cap, spent, _commitment) in before.datasets.items():
        row = rows[dataset_id]
        carried = spent + (500 if dataset_id == 3 else 0)
        assert row.source is not None and int(row.source.cap) == cap
        assert int(row.source.spent) == carried == int(row.privacy_spent)
        assert row.disjoint  # a source of its own
    assert mirror.Grant.objects.filter(
        dataset__dataset_id=1, grantee=chain.accounts[1].address, active=True
    ).exists()
    old_job = mirror.Job.objects.get(job_id=chain.job)
    assert (old_job.status, old_job.current_round) == (mirror.Job.Status.RUNNING, 1)


def test_a_job_of_the_new_contracts_keeps_the_old_jobs_rows(chain):
    """The new FederatedLearning continues the predecessor's job numbering (its constructor's
    firstJobId), so a new job never takes an old job's row in a node's mirror or job tables."""
    from backend.ledger.resources import JobSpec

    w3, members = chain.w3, chain.ledgers[:MEMBERS]
    carry_over(w3, chain.old, members[0], members)
    now = w3.eth.get_block("latest")["timestamp"]
    spec = JobSpec(b"\x01" * 32, b"\x11" * 32, b"\x22" * 32, 1, 1, 1, 1, now + 3600, 600, 600)
    assert members[0].fl.propose_job(spec) > chain.job
