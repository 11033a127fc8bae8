"""Moving a consortium to this release's contracts (the harness: tests/upgrade/contract_upgrade.py).

The previous release's contracts, deployed and filled on an in-process chain (members, a dataset
each, a grant, a DP job running with spends), are carried over to this release's contracts as
docs/OPERATIONS.md (Upgrades) says: members, datasets (same ids, caps, commitments), their spent
privacy and the grants are the same afterwards; the old job goes on spending on the old contracts
and the new budget sources count it; it stays readable through the new contracts file's
``previous``; a node of this release then works on the new deployment (a job on an imported
dataset, its spend counted on top of the carried one).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backend.ledger import errors
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger, load_deployment, save_deployment
from backend.ledger.resources import JobSpec, JobStatus, SpendKind
from backend.ledger.versions import check_deployment, deployed_versions
from tests.upgrade.contract_upgrade import (
    MEMBERS,
    carry_over,
    read_new_state,
    read_old_state,
    spend_on_old_job,
)


def test_the_previous_release_s_consortium_is_read_through_its_own_views(chain):
    state = read_old_state(chain.w3, chain.old)
    assert sorted(state.members) == sorted(a.address for a in chain.accounts[:MEMBERS])
    assert {owner for owner, *_ in state.datasets.values()} == set(state.members)
    assert [spent for _owner, _samples, _cap, spent, _content in state.datasets.values()] == [
        1000,
        2000,
        3000,
    ]
    assert len(state.grants) == 1


def test_this_node_speaks_both_deployments(chain):
    client = ChainClient(chain.w3, chain.accounts[0])
    old = SimpleNamespace(client=client, deployment=SimpleNamespace(addresses=chain.old))
    new = SimpleNamespace(client=client, deployment=chain.new)
    assert [v.version for v in deployed_versions(old)] == [1, 1, 1]
    assert [v.version for v in deployed_versions(new)] == [2, 2, 2]
    assert check_deployment(old) is None and check_deployment(new) is None


def test_members_datasets_grants_and_spends_are_carried_over_and_the_old_job_stays_readable(chain, tmp_path):
    w3, members, outsider = chain.w3, chain.ledgers[:MEMBERS], chain.ledgers[MEMBERS]
    before = read_old_state(w3, chain.old)

    carry_over(w3, chain.old, members[0], members)

    after = read_new_state(members[0])
    assert after.members == before.members
    assert after.datasets == before.datasets  # same ids, owners, samples, caps, spent, commitments
    assert after.grants == before.grants
    assert not members[0].nodes.import_open()
    with pytest.raises(errors.DuplicateDataset):  # a carried commitment gets no fresh budget
        members[0].data.register_dataset(before.datasets[1][4], b"\x09" * 32, b"\x05" * 32, 10, 1_000_000)

    # The old job finishes on the old contracts; what it spends there is counted here too.
    spend_on_old_job(w3, chain.old, chain.accounts[1], chain.job, 7000)
    assert members[0].data.get_source(members[0].data.source_of(2)).spent == 2000
    receipt = outsider.data.sync_spent(2)  # anyone, at any time
    assert receipt.event("PrivacyCarried").args["amount"] == 7000
    assert members[0].data.get_source(members[0].data.source_of(2)).spent == 2000 + 7000

    # The new contracts file keeps the old deployment as `previous`: its jobs are read from there.
    contracts = tmp_path / "contracts.json"
    save_deployment(chain.new, contracts)
    loaded = load_deployment(contracts)
    assert loaded.previous is not None and loaded.previous.addresses == chain.old
    reader = Ledger(ChainClient(w3, chain.accounts[MEMBERS]), loaded).previous
    assert reader is not None and reader.fl.version == 1
    old_job = reader.fl.get_job(chain.job)
    assert (old_job.status, old_job.round, old_job.rounds, old_job.proposer) == (
        JobStatus.RUNNING,
        1,
        2,
        chain.accounts[0].address,
    )
    assert old_job.participant_count == MEMBERS and reader.fl.job_count() == chain.job

    # A node of this release works on the new deployment: a job on the carried datasets, whose
    # spends count on top of what the old contracts recorded (both the sync and the new spend).
    now = w3.eth.get_block("latest")["timestamp"]
    spec = JobSpec(
        config_hash=b"\x01" * 32,
        initial_model_ref=b"\x11" * 32,
        initial_model_hash=b"\x22" * 32,
        rounds=1,
        committee_size=1,
        top_k=1,
        min_trainers=1,
        join_deadline=now + 3600,
        train_period=600,
        score_period=600,
        max_spend_per_round=100_000,
    )
    job = members[0].fl.propose_job(spec)
    for i, member in enumerate(members):
        member.fl.join(job, i + 1)
    members[0].fl.start_job(job)
    for member in members:
        member.fl.reveal_draw_secret(job)
    assert members[0].fl.get_job(job).status is JobStatus.RUNNING
    spend_on_old_job(w3, chain.old, chain.accounts[2], chain.job, 500)  # not synced by anyone yet
    trainer = next(m for m in members if m.client.address not in members[0].fl.committee(job))
    dataset = members.index(trainer) + 1
    carried = before.datasets[dataset][3] + (7000 if dataset == 2 else 500 if dataset == 3 else 0)
    receipt = trainer.fl.spend_privacy(job, 1, 40_000, SpendKind.UPDATE, steps=10)
    assert receipt.event("PrivacySpent").args["sourceTotal"] == carried + 40_000
    assert trainer.data.get_source(trainer.data.source_of(dataset)).spent == carried + 40_000
