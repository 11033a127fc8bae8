"""The import's rules against hostile members and deployers (NodeRegistry / DataRegistry with a
predecessor; backend/ledger/upgrade.py's checks before a member confirms).

The chain (tests/upgrade/conftest.py): the previous release's contracts with 3 members, a dataset
each and a running job; this release's deployed with them as predecessors, nothing imported yet.
"""

from __future__ import annotations

import pytest

from backend.ledger import errors
from backend.ledger.artifacts import load_artifact
from backend.ledger.client import ChainClient
from backend.ledger.contracts import NodeRegistry
from backend.ledger.deployment import Ledger, deploy_contracts
from backend.ledger.resources import JobSpec
from backend.ledger.upgrade import carry_over, code_matches, confirm_import, import_status, upgrade_problems
from devnet.consortium import overlay_of, public_key
from tests.upgrade.contract_upgrade import MEMBERS, old_contract, previous_deployment, transact


def _spec(w3) -> JobSpec:
    now = w3.eth.get_block("latest")["timestamp"]
    return JobSpec(
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
    )


def test_nothing_is_written_and_nobody_is_a_member_while_the_import_is_open(chain):
    members, outsider = chain.ledgers[:MEMBERS], chain.ledgers[MEMBERS]
    carry_over(members[0])
    assert members[0].nodes.import_open() and import_status(members[0]).complete
    assert members[0].nodes.member_count() == MEMBERS
    assert not any(members[0].nodes.is_member(m.client.address) for m in members)
    account = outsider.client.account
    with pytest.raises(errors.ImportOpen):
        outsider.nodes.register_node(
            "late", "http://late.test", public_key(account), overlay_of(account.address)
        )
    with pytest.raises(errors.ImportOpen):
        members[0].nodes.vote_admission(outsider.client.address)
    with pytest.raises(errors.ImportOpen):
        members[0].nodes.update_endpoint("http://moved.test")
    with pytest.raises(errors.ImportOpen):
        members[1].nodes.leave()
    with pytest.raises(errors.ImportOpen):
        members[0].nodes.vote_removal(members[1].client.address)
    with pytest.raises(errors.ImportOpen):
        members[0].data.register_dataset(b"\x31" * 32, b"\x32" * 32, b"\x05" * 32, 10, 1_000_000)
    with pytest.raises(errors.ImportOpen):
        members[0].data.grant(1, members[2].client.address, b"\x01" * 113, 1_000_000)
    with pytest.raises(errors.NotMember):  # FederatedLearning asks isMember: false for everyone
        members[0].fl.propose_job(_spec(chain.w3))


def test_a_hostile_member_cannot_close_a_partial_import(chain):
    """Member 0 imports itself alone and confirms: refused. Every member but no dataset: refused.
    Two datasets of three: refused. Only the whole copy can be confirmed."""
    members = chain.ledgers[:MEMBERS]
    hostile = members[0]
    hostile.nodes.import_members([hostile.client.address])
    assert not hostile.nodes.members_complete()
    with pytest.raises(errors.ImportIncomplete) as refused:
        hostile.nodes.confirm_import()
    assert refused.value.args_["what"] == "members"
    hostile.nodes.import_members([m.client.address for m in members])
    with pytest.raises(errors.ImportIncomplete) as refused:
        hostile.nodes.confirm_import()
    assert refused.value.args_["what"] == "datasets"
    hostile.data.import_datasets(1, 2)
    with pytest.raises(errors.ImportIncomplete):
        hostile.nodes.confirm_import()
    hostile.data.import_datasets(3, 3)
    hostile.nodes.confirm_import()  # now complete: its confirmation counts (one of the two needed)
    assert hostile.nodes.import_open()


def test_only_members_of_the_predecessor_are_imported(chain):
    """An account that never was a member there, and one that applied without being admitted,
    are not copied: the data comes from the predecessor's views, not from the caller."""
    members, outsider = chain.ledgers[:MEMBERS], chain.ledgers[MEMBERS]
    account = chain.accounts[MEMBERS]
    registry = old_contract(chain.w3, chain.old, "NodeRegistry")
    transact(
        chain.w3,
        account,
        registry.functions.registerNode(
            "applicant", "http://a.test", public_key(account), overlay_of(account.address)
        ),
    )
    outsider.nodes.import_members([account.address, chain.accounts[0].address])
    assert outsider.nodes.members() == [chain.accounts[0].address]
    info = outsider.nodes.get_node(account.address)
    assert info.name == "" and int(info.status) == 0
    assert members[0].nodes.get_node(chain.accounts[0].address).name == "org-0"


def test_a_member_gone_from_the_predecessor_is_dropped_and_its_confirmation_stops_counting(chain):
    members = chain.ledgers[:MEMBERS]
    carry_over(members[0])
    members[2].nodes.confirm_import()  # one of the two confirmations needed of three members
    registry = old_contract(chain.w3, chain.old, "NodeRegistry")
    transact(chain.w3, chain.accounts[2], registry.functions.leaveConsortium())
    with pytest.raises(errors.ImportIncomplete):  # the copy is no longer the predecessor's set
        members[0].nodes.confirm_import()
    carry_over(members[1])  # anyone brings the import up to date: member 2 is dropped
    assert members[0].nodes.members() == [chain.accounts[0].address, chain.accounts[1].address]
    receipt = members[0].nodes.confirm_import()
    voted = receipt.event("ImportConfirmVoted").args
    assert (voted["votes"], voted["needed"]) == (1, 2)  # member 2's vote is gone with it
    assert members[0].nodes.import_open()
    with pytest.raises(errors.NotMember):
        members[2].nodes.confirm_import()
    members[1].nodes.confirm_import()
    assert not members[0].nodes.import_open()
    assert not members[0].nodes.is_member(chain.accounts[2].address)
    assert members[0].nodes.is_member(chain.accounts[1].address)


def test_the_threshold_closes_the_import_for_good(chain):
    members, outsider = chain.ledgers[:MEMBERS], chain.ledgers[MEMBERS]
    carry_over(outsider)  # anyone may carry
    with pytest.raises(errors.NotMember):
        outsider.nodes.confirm_import()
    receipt = members[0].nodes.confirm_import()
    assert [e.name for e in receipt.events] == ["ImportConfirmVoted"]
    with pytest.raises(errors.AlreadyVoted):
        members[0].nodes.confirm_import()
    receipt = members[1].nodes.confirm_import()
    assert [e.name for e in receipt.events] == ["ImportConfirmVoted", "ImportClosed"]
    assert not members[0].nodes.import_open() and members[0].nodes.is_member(chain.accounts[2].address)
    for closed in (
        lambda: members[2].nodes.confirm_import(),
        lambda: outsider.nodes.import_members([chain.accounts[0].address]),
        lambda: outsider.data.import_datasets(1, 1),
    ):
        with pytest.raises(errors.ImportNotOpen):
            closed()
    # the consortium works again: a registration by vote, as before any upgrade
    account = outsider.client.account
    outsider.nodes.register_node("late", "http://late.test", public_key(account), overlay_of(account.address))
    members[0].nodes.vote_admission(account.address)
    members[1].nodes.vote_admission(account.address)
    assert members[0].nodes.is_member(account.address)


def test_datasets_are_imported_in_order_and_within_the_predecessor_s(chain):
    outsider = chain.ledgers[MEMBERS]
    for first, last in ((0, 1), (2, 3), (1, 4), (2, 1)):
        with pytest.raises(errors.InvalidDataset):
            outsider.data.import_datasets(first, last)
    outsider.data.import_datasets(1, 1)
    outsider.data.import_datasets(1, 3)  # dataset 1 again: only its spend is brought up to date
    assert outsider.data.imported_count() == 3 == outsider.data.dataset_count()
    assert [outsider.data.source_of(i) for i in (1, 2, 3)] == [1, 2, 3]  # a source each


def test_only_the_deployer_wires_the_data_import_once(chain):
    deployer, member = chain.ledgers[0], chain.ledgers[1]
    with pytest.raises(errors.AlreadyWired):
        deployer.nodes.wire_data_import(deployer.data.address)
    fresh = NodeRegistry(
        deployer.client.deploy(load_artifact("NodeRegistry"), 51, chain.old["NodeRegistry"]).contract_address,
        deployer.client,
    )
    with pytest.raises(errors.Unauthorized):
        NodeRegistry(fresh.address, member.client).wire_data_import(deployer.data.address)
    with pytest.raises(errors.InvalidDataset):  # a DataRegistry of another registry
        fresh.wire_data_import(deployer.data.address)


def test_a_member_s_node_refuses_to_confirm_what_a_hostile_deployer_got_wrong(chain):
    w3, members = chain.w3, chain.ledgers[:MEMBERS]
    runs_on = previous_deployment(w3, chain.old)
    assert upgrade_problems(members[1], runs_on) == [
        "the import is not complete: 0 of 3 members (not the same set), 0 of 3 datasets (run `manage.py "
        "ledger import`)"
    ]
    carry_over(members[0])
    assert upgrade_problems(members[1], runs_on) == []

    # a deployment whose threshold lets one member close the import
    lax = deploy_contracts(
        ChainClient(w3, chain.accounts[0]),
        admission_threshold_pct=1,
        allow_small_committees=True,
        predecessor=runs_on,
    )
    lax_ledger = Ledger(members[1].client, lax)
    carry_over(lax_ledger)
    assert upgrade_problems(lax_ledger, runs_on) == [
        "the new admission threshold is 1%, the consortium's 51%"
    ]
    with pytest.raises(errors.LedgerError, match="admission threshold"):
        confirm_import(lax_ledger, runs_on)

    # one whose jobs take other committee sizes than the consortium's (here: the old contracts
    # are a development deployment, the new one is not)
    other = Ledger(
        members[1].client, deploy_contracts(ChainClient(w3, chain.accounts[0]), predecessor=runs_on)
    )
    carry_over(other)
    assert upgrade_problems(other, runs_on) == [
        "the new FederatedLearning does not take the consortium's committee sizes (allowSmallCommittees)"
    ]

    # a deployment importing from a consortium this node does not run on
    elsewhere = dict(runs_on.addresses, NodeRegistry=lax.address("NodeRegistry"))
    problems = upgrade_problems(members[1], runs_on.__class__(runs_on.chain_id, 1, elsewhere))
    assert any("imports from" in p for p in problems)

    # code that is not this release's at one of the addresses
    forged = chain.new.__class__(
        chain.new.chain_id,
        chain.new.block,
        dict(chain.new.addresses, JobLogic=chain.new.address("DataRegistry")),
        previous=chain.new.previous,
    )
    assert upgrade_problems(Ledger(members[1].client, forged), runs_on) == [
        f"the code at JobLogic {chain.new.address('DataRegistry')} is not this release's JobLogic"
    ]
    confirm_import(members[1], runs_on)  # the honest deployment: confirmed


def test_code_matches_allows_only_the_immutables_to_differ():
    runtime = load_artifact("NodeRegistry").deployed_bytecode
    start = runtime.index(b"\x00" * 32)
    filled = runtime[:start] + b"\x07" * 32 + runtime[start + 32 :]
    assert code_matches(runtime, filled)
    changed = bytearray(filled)
    changed[1] ^= 0xFF
    assert not code_matches(runtime, bytes(changed))
    assert not code_matches(runtime, filled + b"\x00")
