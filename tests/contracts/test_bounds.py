"""Every contract bounds what it accepts: strings, ids, rounds, periods and deadlines, plans.

The limits are the job configuration's (fl_node/job/config.py, serializers.py) or tighter, so
every node's mirror can store any value the chain accepted.
"""

from __future__ import annotations

import pytest
from eth_abi import encode
from eth_utils import function_signature_to_4byte_selector

from backend.ledger import errors
from backend.ledger.abi import ContractCall
from backend.ledger.resources import NodeStatus
from devnet.consortium import overlay_of, public_key

DAY = 24 * 3600


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rounds", 10_001),  # the API's limit is 10_000
        ("min_trainers", 198),  # with a committee of 3: more than 200 participants needed
        ("train_period", 7 * DAY + 1),
        ("score_period", 7 * DAY + 1),
        ("max_spend_per_round", 100_000_001),  # above the largest dataset cap (epsilon 100)
    ],
)
def test_propose_job_bounds(fed, field, value):
    with pytest.raises(errors.InvalidJobSpec):
        fed.member(0).fl.propose_job(fed.spec(**{field: value}))


def test_propose_job_bounds_accept_the_limits(fed):
    fl = fed.member(0).fl
    job = fl.propose_job(
        fed.spec(
            rounds=10_000,
            committee_size=15,
            top_k=255,
            min_trainers=184,
            train_period=7 * DAY,
            score_period=7 * DAY,
            join_deadline=fed.now() + 30 * DAY,
            max_spend_per_round=100_000_000,
        )
    )
    state = fl.get_job(job)
    assert (state.rounds, state.max_spend_per_round) == (10_000, 100_000_000)


def test_join_deadline_is_bounded(fed):
    fl = fed.member(0).fl
    with pytest.raises(errors.InvalidJobSpec) as caught:
        fl.propose_job(fed.spec(join_deadline=2**63))  # the deadline that overflowed signed columns
    assert caught.value.args_ == {"reason": "joinDeadline"}
    with pytest.raises(errors.InvalidJobSpec):
        fl.propose_job(fed.spec(join_deadline=fed.now() + 32 * DAY))
    block = fed.w3.eth.block_number
    with pytest.raises(errors.InvalidJobSpec):
        fl.propose_job(fed.spec(use_blocks=True, join_deadline=block + 32 * DAY))


def test_join_refuses_a_dataset_id_that_does_not_exist(fed):
    job = fed.member(0).fl.propose_job(fed.spec())
    for dataset_id in (0, 13, 2**64 + 1, 2**256 - 1):
        with pytest.raises(errors.DatasetNotUsable):
            fed.join(job, 1, dataset_id)


def _raw_register(ledger, name: bytes, endpoint: bytes) -> ContractCall:
    """registerNode with raw bytes for the strings (not valid UTF-8 perhaps): ABI-encoded alike."""
    account = ledger.client.account
    selector = function_signature_to_4byte_selector("registerNode(string,string,bytes,bytes32)")
    args = encode(
        ["bytes", "bytes", "bytes", "bytes32"],
        [name, endpoint, public_key(account), overlay_of(account.address)],
    )
    return ContractCall(ledger.nodes.address, "registerNode", selector + args, ())


@pytest.mark.parametrize(
    ("name", "endpoint", "error", "args"),
    [
        (b"n" * 65, b"http://x", errors.FieldTooLong, {"field": "name", "length": 65, "limit": 64}),
        (
            b"n",
            b"http://" + b"x" * 250,
            errors.FieldTooLong,
            {"field": "endpoint", "length": 257, "limit": 256},
        ),
        (b"bad\xffname", b"http://x", errors.InvalidText, {"field": "name", "position": 3}),  # not UTF-8
        (b"line\nbreak", b"http://x", errors.InvalidText, {"field": "name", "position": 4}),
        ("caf\u00e9".encode(), b"http://x", errors.InvalidText, {"field": "name", "position": 3}),
        (b"n", b"http://x y", errors.InvalidText, {"field": "endpoint", "position": 8}),
        (b"n", b"http://x\x00", errors.InvalidText, {"field": "endpoint", "position": 8}),
        (b"", b"http://x", errors.EmptyField, {"field": "name"}),
        (b"n", b"", errors.EmptyField, {"field": "endpoint"}),
    ],
)
def test_register_node_bounds_its_strings(fed, name, endpoint, error, args):
    outsider = fed.outsider()
    with pytest.raises(error) as caught:
        outsider.client.transact(_raw_register(outsider, name, endpoint))
    assert caught.value.args_ == args
    assert outsider.nodes.get_node(outsider.client.address).status is NodeStatus.NONE


def test_register_node_accepts_the_limits(fed):
    outsider = fed.outsider()
    name, endpoint = "N" * 64, "https://" + "e" * 248
    outsider.client.transact(_raw_register(outsider, name.encode(), endpoint.encode()))
    info = outsider.nodes.get_node(outsider.client.address)
    assert (info.name, info.endpoint, info.status) == (name, endpoint, NodeStatus.APPLIED)


def test_update_endpoint_bounds(fed):
    nodes = fed.member(1).nodes
    with pytest.raises(errors.FieldTooLong):
        nodes.update_endpoint("http://" + "x" * 250)
    with pytest.raises(errors.InvalidText):
        nodes.update_endpoint("http://x\u2028")
    with pytest.raises(errors.EmptyField):
        nodes.update_endpoint("")
    nodes.update_endpoint("http://moved.test:8080/peer")
    assert nodes.get_node(fed.address(1)).endpoint == "http://moved.test:8080/peer"
