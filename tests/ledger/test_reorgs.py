"""The mirror follows the canonical chain: a reorganisation's dropped events leave it (issue 38).

A real anvil is rewound (``evm_snapshot`` / ``evm_revert``) under an indexed mirror and given
other transactions: after the next pass the mirror must equal the one a fresh indexer derives
from the chain as it now is, and the claims of the rounds the dropped events named are gone.
"""

from __future__ import annotations

import types
from typing import Any, cast

import pytest
from web3 import HTTPProvider, Web3

from backend.jobs.chain import replan_unwound
from backend.jobs.models import RoundAction
from backend.ledger import reorgs
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger, deploy_contracts
from backend.ledger.indexer import EventIndexer
from backend.ledger.models import ChainEvent, Dataset, IndexerCursor, RejectedEvent
from devnet.anvil import AnvilProcess
from devnet.consortium import bootstrap_consortium, dev_account

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def chain():
    with AnvilProcess() as anvil:
        clients = []
        for i in range(3):
            account = dev_account(i, "reorg-tests")
            anvil.fund(account.address)
            clients.append(ChainClient(Web3(HTTPProvider(anvil.url)), account))
        deployment = deploy_contracts(clients[0], allow_small_committees=True)
        ledgers = [Ledger(client, deployment) for client in clients]
        bootstrap_consortium(ledgers, [f"http://r{i}.test" for i in range(3)])
        yield anvil, ledgers


def _register(ledger: Ledger, tag: int) -> int:
    return ledger.data.register_dataset(
        bytes([tag]) * 32, bytes([tag + 1]) * 32, b"\x05" * 32, 100 + tag, 3_000_000
    )


def _rewind(anvil: AnvilProcess, ledgers: list[Ledger], snapshot: str) -> None:
    assert anvil.rpc("evm_revert", [snapshot]) is True
    for ledger in ledgers:
        ledger.client.nonces.reset()  # the chain's nonces went back with it


def _dump() -> dict[str, list]:
    """Every mirror table's rows, without row ids (a relation as the related row's own fields)."""

    def row(obj: Any) -> tuple:
        values = []
        for field in obj._meta.concrete_fields:
            if field.primary_key:
                continue
            value = getattr(obj, field.name)
            values.append((field.name, row(value) if field.is_relation and value is not None else value))
        return tuple(values)

    return {m.__name__: sorted(map(row, m.objects.all()), key=repr) for m in reorgs.derived_models()}


def _fresh_mirror(ledger: Ledger) -> dict[str, list]:
    """The mirror a new node would derive from the chain as it is now."""
    for model in [*reversed(reorgs.derived_models()), ChainEvent, RejectedEvent, IndexerCursor]:
        model.objects.all().delete()
    EventIndexer(ledger.client, ledger.deployment).sync()
    return _dump()


def test_a_rewound_chain_with_other_events_leaves_the_mirror_equal_to_the_chain(chain):
    anvil, ledgers = chain
    indexer = EventIndexer(ledgers[0].client, ledgers[0].deployment)
    assert indexer.sync().unwound is None
    snapshot = anvil.rpc("evm_snapshot")
    dropped_id = _register(ledgers[0], 10)
    indexer.sync()
    assert Dataset.objects.get(dataset_id=dropped_id).owner == ledgers[0].client.address

    _rewind(anvil, ledgers, snapshot)
    first, second = _register(ledgers[1], 20), _register(ledgers[2], 30)
    anvil.rpc("evm_mine")  # the new branch is longer than the old one
    result = indexer.sync()

    assert result.unwound is not None and result.unwound.dropped >= 1
    assert first == dropped_id  # the same id, another owner: only an unwind gets it right
    assert Dataset.objects.get(dataset_id=first).owner == ledgers[1].client.address
    assert Dataset.objects.get(dataset_id=second).owner == ledgers[2].client.address
    mirrored = _dump()
    assert mirrored == _fresh_mirror(ledgers[0])
    assert indexer.sync().unwound is None  # settled: the next pass finds nothing to unwind


def test_a_chain_rewound_below_the_cursor_is_unwound_to_its_head(chain):
    anvil, ledgers = chain
    indexer = EventIndexer(ledgers[0].client, ledgers[0].deployment)
    indexer.sync()
    before = _dump()
    snapshot = anvil.rpc("evm_snapshot")
    _register(ledgers[1], 40)
    indexer.sync()
    assert _dump() != before

    _rewind(anvil, ledgers, snapshot)
    head = ledgers[0].client.block_number()
    result = indexer.sync()

    assert result.unwound is not None and result.unwound.fork_block <= head
    assert _dump() == before == _fresh_mirror(ledgers[0])


def test_unwinding_forgets_the_claims_of_the_dropped_rounds_and_the_next():
    me, other = "0x" + "aa" * 20, "0x" + "bb" * 20
    for node, job, round_, state in [
        (me, 7, 2, RoundAction.State.DONE),  # dropped round: planned again
        (me, 7, 3, RoundAction.State.WAITING),  # the round it opened: planned again
        (me, 7, 4, RoundAction.State.DONE),  # later rounds stay
        (me, 7, 2, RoundAction.State.RUNNING),  # in flight: it re-checks the contract itself
        (other, 7, 2, RoundAction.State.DONE),  # another node's claims stay
    ]:
        kind = RoundAction.Kind.SCORE if state == RoundAction.State.RUNNING else RoundAction.Kind.TRAIN
        RoundAction.objects.create(node=node, job_id=job, round=round_, kind=kind, state=state)
    ctx = cast(Any, types.SimpleNamespace(address=me))

    assert replan_unwound(ctx, frozenset({(7, 2)})) == 2

    left = set(RoundAction.objects.values_list("node", "round", "state"))
    assert left == {
        (me, 4, RoundAction.State.DONE),
        (me, 2, RoundAction.State.RUNNING),
        (other, 2, RoundAction.State.DONE),
    }


def test_every_mirror_table_is_written_by_the_projections():
    """A table added to the ledger is either derived from events (rebuilt on an unwind) or named
    in reorgs.NOT_DERIVED; never silently left out of the rebuild."""
    source = open(reorgs.projections.__file__).read()
    for model in reorgs.derived_models():
        assert f"{model.__name__}." in source or f"{model.__name__}(" in source, model.__name__


def test_fork_point_is_the_block_before_the_first_difference():
    a, b, c = ("0xa", 0, 10), ("0xb", 0, 12), ("0xc", 1, 12)
    assert reorgs.fork_point({a, b}, {a, b}, indexed=15, head=20) is None
    assert reorgs.fork_point({a, b}, {a, c}, indexed=15, head=20) == 11
    assert reorgs.fork_point({a, b}, {a}, indexed=15, head=20) == 11  # dropped
    assert reorgs.fork_point({a}, {a, b}, indexed=15, head=20) == 11  # added on the new branch
    assert reorgs.fork_point({a, b}, {a, b}, indexed=15, head=13) == 13  # shorter, same events
    assert reorgs.fork_point({a, b}, {a}, indexed=15, head=11) == 11
