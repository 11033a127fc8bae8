"""NodeRegistry: bootstrap by the deployer, admission and removal by vote, endpoint, leave."""

from __future__ import annotations

import pytest

from backend.ledger import errors
from backend.ledger.resources import NodeStatus
from devnet.consortium import overlay_of, public_key


def _apply(ledger, name="new"):
    account = ledger.client.account
    return ledger.nodes.register_node(
        name, "http://new.test", public_key(account), overlay_of(account.address)
    )


def test_consortium_after_bootstrap(fed):
    nodes = fed.member(0).nodes
    assert nodes.member_count() == 12
    info = nodes.get_node(fed.address(3))
    assert info.status is NodeStatus.MEMBER and info.endpoint == "http://node3.test"
    assert info.pubkey == public_key(fed.member(3).client.account)
    assert nodes.votes_needed() == 7  # ceil(12 * 51 / 100)


def test_admission_needs_a_vote_threshold(fed):
    newcomer = fed.outsider()
    with pytest.raises(errors.NotApplicant):
        fed.member(0).nodes.vote_admission(newcomer.client.address)
    receipt = _apply(newcomer)
    assert receipt.event("NodeApplied").args["name"] == "new"
    with pytest.raises(errors.AlreadyApplied):
        _apply(newcomer)
    with pytest.raises(errors.NotMember):  # an applicant cannot vote for itself
        newcomer.nodes.vote_admission(newcomer.client.address)
    for i in range(6):
        fed.member(i).nodes.vote_admission(newcomer.client.address)
    with pytest.raises(errors.AlreadyVoted):
        fed.member(0).nodes.vote_admission(newcomer.client.address)
    assert not newcomer.nodes.is_member(newcomer.client.address)
    receipt = fed.member(6).nodes.vote_admission(newcomer.client.address)
    assert [e.name for e in receipt.events] == ["AdmissionVoted", "NodeAdmitted"]
    assert newcomer.nodes.is_member(newcomer.client.address)
    with pytest.raises(errors.AlreadyMember):
        _apply(newcomer)


def test_a_vote_counts_only_while_its_voter_is_a_member(fed):
    """Issue 32: six members vote for an applicant, then one of them leaves and another is removed;
    their votes no longer count, so the seventh vote does not admit it (12 - 2 = 10 members need 6,
    and only 4 + 1 of the voters are still members)."""
    newcomer = fed.outsider()
    _apply(newcomer)
    for i in range(6):
        fed.member(i).nodes.vote_admission(newcomer.client.address)
    fed.member(0).nodes.leave()
    for voter in range(2, 8):  # six of the remaining eleven remove member 1
        fed.member(voter).nodes.vote_removal(fed.address(1))
    assert not fed.member(2).nodes.is_member(fed.address(1))
    assert fed.member(2).nodes.votes_needed() == 6
    receipt = fed.member(6).nodes.vote_admission(newcomer.client.address)
    assert receipt.event("AdmissionVoted").args["votes"] == 5  # members 2..6; 0 and 1 are gone
    assert not newcomer.nodes.is_member(newcomer.client.address)
    fed.member(7).nodes.vote_admission(newcomer.client.address)
    assert newcomer.nodes.is_member(newcomer.client.address)


def test_registration_checks_key_and_fields(fed):
    ledger = fed.outsider()
    account = ledger.client.account
    other_key = public_key(fed.member(0).client.account)
    with pytest.raises(errors.InvalidPublicKey):
        ledger.nodes.register_node("x", "http://x", other_key, b"\x00" * 32)
    with pytest.raises(errors.InvalidPublicKey):
        ledger.nodes.register_node("x", "http://x", public_key(account)[:33], b"\x00" * 32)
    with pytest.raises(errors.EmptyField):
        ledger.nodes.register_node("", "http://x", public_key(account), b"\x00" * 32)
    with pytest.raises(errors.EmptyField):
        ledger.nodes.register_node("x", "", public_key(account), b"\x00" * 32)


def test_update_endpoint_leave_and_removal(fed):
    nodes = fed.member(5).nodes
    receipt = nodes.update_endpoint("https://five.example")
    assert receipt.event("EndpointUpdated").args["endpoint"] == "https://five.example"
    assert nodes.get_node(fed.address(5)).endpoint == "https://five.example"
    with pytest.raises(errors.NotMember):
        fed.outsider().nodes.update_endpoint("http://x")
    with pytest.raises(errors.EmptyField):
        nodes.update_endpoint("")
    nodes.leave()
    assert not nodes.is_member(fed.address(5)) and nodes.member_count() == 11
    with pytest.raises(errors.NotMember):
        nodes.leave()
    target = fed.address(11)
    with pytest.raises(errors.NotMember):
        fed.member(0).nodes.vote_removal(fed.address(5))
    needed = fed.member(0).nodes.votes_needed()  # ceil(11 * 0.51) = 6
    for i in [0, 1, 2, 3, 4, 6][:needed]:  # member 5 has left
        receipt = fed.member(i).nodes.vote_removal(target)
    assert receipt.events[-1].name == "NodeRemoved"
    assert not fed.member(0).nodes.is_member(target)
    assert target not in fed.member(0).nodes.members()
