"""The indexer's rejections: the happy path's queries, replays, the database's own errors, the
lossless uint256 columns and GET /api/events with rejected events."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from backend.identity.roles import Role
from backend.ledger import models, projections
from backend.ledger.indexer import EventIndexer, is_event_fault
from backend.nodes.accounts import api_token, create_or_update_user
from tests.adversarial.hostile_chain import craft_log, event_args

U64_MAX = 2**64 - 1


def _indexer(federation) -> EventIndexer:
    return EventIndexer(federation[0].client, federation[0].deployment)


def _endpoint_log(federation, block: int, position: int, endpoint: bytes | str) -> dict:
    node = federation[1].client.address
    args = event_args("NodeRegistry", "EndpointUpdated", node=node, endpoint=endpoint)
    return craft_log(
        federation[0].deployment, "NodeRegistry", "EndpointUpdated", args, block=block, log_index=position
    )


@pytest.mark.django_db
def test_happy_path_stores_a_batch_with_one_insert_and_no_savepoint(federation):
    indexer = _indexer(federation)
    indexer.sync()
    block = indexer.last_block()
    logs = [_endpoint_log(federation, block, i, f"http://n1-{i}.test") for i in range(5)]
    with CaptureQueriesContext(connection) as queries:
        result = indexer.store_logs(logs, block)
    sql = [q["sql"].upper() for q in queries.captured_queries]
    assert (result.new_events, result.rejected) == (5, 0)
    assert sum("INSERT INTO" in s and "LEDGER_CHAINEVENT" in s for s in sql) == 1
    assert not [s for s in sql if "REJECTEDEVENT" in s]
    # the batch's transaction (a savepoint here, inside the test's transaction), none per event
    assert sum(s.startswith("SAVEPOINT") for s in sql) == 1


@pytest.mark.django_db
def test_a_poisoned_batch_keeps_its_valid_events_and_a_replay_adds_nothing(federation):
    indexer = _indexer(federation)
    indexer.sync()
    block = indexer.last_block()
    logs = [
        _endpoint_log(federation, block, 0, "http://before.test"),
        _endpoint_log(federation, block, 1, b"http://" + b"x" * 600),  # longer than the column
        _endpoint_log(federation, block, 2, "http://after.test"),
    ]
    first = indexer.store_logs(logs, block)
    assert (first.events, first.new_events, first.rejected) == (3, 2, 1)
    assert models.Node.objects.get(address=federation[1].client.address).endpoint == "http://after.test"
    rejected = models.RejectedEvent.objects.get()
    assert (rejected.name, rejected.contract, rejected.block_number) == (
        "EndpointUpdated",
        "NodeRegistry",
        block,
    )
    assert rejected.reason == "endpoint longer than 500 characters"
    again = indexer.store_logs(logs, block)  # a replay (cursor reset, restart)
    assert again.new_events == 0 and models.RejectedEvent.objects.count() == 1
    assert models.ChainEvent.objects.filter(name="EndpointUpdated", block_number=block).count() == 2


@pytest.mark.django_db
def test_a_database_error_is_not_blamed_on_the_event(federation, monkeypatch):
    """A locked or lost database aborts the batch (retried on the next pass): no event is
    rejected for it and the cursor stays."""
    indexer = _indexer(federation)
    indexer.sync()
    before = indexer.last_block()

    def locked(event):
        raise OperationalError("database is locked")

    monkeypatch.setitem(projections.HANDLERS, "EndpointUpdated", locked)
    with pytest.raises(OperationalError):
        indexer.store_logs([_endpoint_log(federation, before + 1, 0, "http://x.test")], before + 1)
    assert indexer.last_block() == before and not models.RejectedEvent.objects.exists()


def test_which_errors_are_the_events_fault():
    assert is_event_fault(projections.Rejected("unknown job 7"))
    assert is_event_fault(OperationalError(1366, "Incorrect string value"))  # MariaDB: the value
    assert not is_event_fault(OperationalError(1213, "Deadlock found"))  # MariaDB: retry
    assert not is_event_fault(OperationalError("database is locked"))  # SQLite: retry
    assert is_event_fault(OverflowError("Python int too large to convert to SQLite INTEGER"))


@pytest.mark.django_db
def test_uint256_columns_keep_order_and_lookups_beyond_2_63():
    values = [3, 2**63 - 1, 2**63, U64_MAX, 2**200, 2**256 - 1]
    for i, value in enumerate(values):
        models.Dataset.objects.create(
            dataset_id=value, owner="0x" + "11" * 20, commitment="0x", swarm_ref="0x", schema_hash="0x",
            samples=value, privacy_cap=i, registered_block=1,
        )  # fmt: skip
    assert list(models.Dataset.objects.order_by("dataset_id").values_list("dataset_id", flat=True)) == values
    assert models.Dataset.objects.get(dataset_id=2**200).samples == 2**200
    assert models.Dataset.objects.filter(dataset_id__gt=2**63).count() == 3
    assert models.Dataset.objects.filter(samples__in=[3, U64_MAX]).count() == 2
    with pytest.raises(ValueError):
        models.Dataset.objects.filter(dataset_id=2**256).exists()


@pytest.mark.django_db
def test_events_api_shows_rejections_and_filters_on_status(monkeypatch):
    from backend.ledger import access as ledger_access

    monkeypatch.setattr(ledger_access, "node_ledger", lambda: None)
    models.ChainEvent.objects.create(
        contract="NodeRegistry", address="0x" + "22" * 20, name="NodeLeft", block_number=9,
        tx_hash="0x" + "09" * 32, log_index=0, args={"node": "0x" + "33" * 20},
    )  # fmt: skip
    models.RejectedEvent.objects.create(
        contract="DataRegistry", address="0x" + "22" * 20, name="PrivacySpent", block_number=10,
        tx_hash="0x" + "0a" * 32, log_index=1, reason="unknown dataset 5", data="0x00", data_size=1,
    )  # fmt: skip
    user, _ = create_or_update_user("viewer-user", Role.VIEWER, password="correct horse")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    every = client.get("/api/events").json()
    assert [(e["name"], e["status"], e["reason"]) for e in every] == [
        ("PrivacySpent", "rejected", "unknown dataset 5"),
        ("NodeLeft", "mirrored", None),
    ]
    assert [e["name"] for e in client.get("/api/events?status=rejected").json()] == ["PrivacySpent"]
    assert [e["name"] for e in client.get("/api/events?status=mirrored").json()] == ["NodeLeft"]
    assert [e["name"] for e in client.get("/api/events?limit=1").json()] == ["PrivacySpent"]
    response = client.get("/api/events?status=lost")
    assert response.status_code == 400 and "status" in response.json()["errors"]


@pytest.mark.django_db
def test_a_flood_of_events_shrinks_the_ranges_requested_and_loses_none(federation, monkeypatch):
    """Attack class: event flood (blocks filled with events, to exhaust a node's memory when it
    fetches a range of them at once): the next ranges are smaller; every event is mirrored."""
    client = federation[0].client
    for i in range(6):
        federation[1 + i % 4].nodes.update_endpoint(f"http://flood-{i}.test")
    head = client.block_number()
    deployment = federation[0].deployment
    total = len(client.get_logs(list(deployment.addresses.values()), deployment.block, head))
    requested: list[tuple[int, int, int]] = []
    get_logs = client.get_logs

    def counted(addresses, start, end):
        logs = get_logs(addresses, start, end)
        requested.append((start, end, len(logs)))
        return logs

    monkeypatch.setattr(client, "get_logs", counted)
    span = max(4, (head - deployment.block) // 3)  # several ranges to the head at full size
    result = EventIndexer(client, deployment, batch_blocks=span, max_logs=2).sync(head)
    assert result.new_events == total == models.ChainEvent.objects.count()
    spans = [end - start + 1 for start, end, _ in requested]
    assert spans[0] == span and requested[0][2] > 2
    assert spans[1] == span // 2  # a crowded range halves the next
    assert len(requested) > 3 and requested[-1][1] == head


@pytest.mark.django_db
def test_events_another_indexer_stored_meanwhile_are_not_rejected(federation, monkeypatch):
    """A node's agent and worker both index: a conflict on an event's (tx hash, log index) means
    the other process stored it. The batch is abandoned for the next pass (which finds it
    stored), and no event is recorded as rejected."""
    from backend.ledger.indexer import StoredElsewhere

    indexer = _indexer(federation)
    indexer.sync()
    block = indexer.last_block()
    logs = [_endpoint_log(federation, block, 0, "http://first.test")]
    indexer.store_logs(logs, block)
    monkeypatch.setattr(EventIndexer, "_known", staticmethod(lambda hashes: set()))  # not seen yet
    with pytest.raises(StoredElsewhere):
        indexer.store_logs(logs + logs, block)  # a repeated log is stored once, not a conflict
    assert not models.RejectedEvent.objects.exists()
    monkeypatch.undo()
    assert indexer.store_logs(logs, block).new_events == 0


@pytest.mark.django_db
def test_follow_survives_a_failed_pass(federation, monkeypatch):
    """Attack class: a chain endpoint (or database) that fails now and then must not end a
    node's `ledger index --follow`: the pass is logged and retried."""
    from backend.ledger.errors import ChainUnavailable

    indexer = _indexer(federation)
    client = federation[0].client
    get_logs = client.get_logs
    failures = iter([ChainUnavailable("get_logs: chain unreachable")])

    def flaky(*args):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return get_logs(*args)

    monkeypatch.setattr(client, "get_logs", flaky)
    stop, results = threading.Event(), []
    indexer.follow(interval=0, stop=stop, on_result=lambda r: (results.append(r), stop.set()))
    assert len(results) == 1 and results[0].to_block == client.block_number()
    assert indexer.last_block() == client.block_number()


@pytest.mark.django_db
def test_the_mirror_holds_whatever_the_contracts_accept(federation):
    """The contracts' bounds fit the mirror's columns, so an honest chain never has a rejected
    event (a rejection is an attack, or a contract and node out of step)."""
    ledger = federation[0]
    limits = {
        (ledger.nodes, "MAX_NAME"): models.Node._meta.get_field("name").max_length,
        (ledger.nodes, "MAX_ENDPOINT"): models.Node._meta.get_field("endpoint").max_length,
        (ledger.data, "MAX_WRAPPED_KEY"): (projections.MAX_WRAPPED_KEY_HEX - 2) // 2,
    }
    for (registry, constant), column in limits.items():
        assert registry._call(constant)[0] <= column, constant
    assert _indexer(federation).sync().rejected == 0


@pytest.mark.django_db
def test_a_range_the_rpc_refuses_to_answer_whole_is_asked_in_halves(federation, monkeypatch):
    """Attack class: event flood against a provider that caps eth_getLogs answers (public RPCs
    refuse a range with "more than 10000 results"): the indexer asks for smaller ranges
    instead of failing on the same one forever."""
    from web3.exceptions import Web3RPCError

    client = federation[0].client
    get_logs = client.get_logs
    asked: list[int] = []

    def capped(addresses, start, end):
        asked.append(end - start + 1)
        if end - start + 1 > 3:
            raise Web3RPCError("query returned more than 10000 results")
        return get_logs(addresses, start, end)

    monkeypatch.setattr(client, "get_logs", capped)
    indexer = EventIndexer(client, federation[0].deployment, batch_blocks=16)
    result = indexer.sync()
    assert indexer.last_block() == client.block_number() and result.new_events > 0
    assert asked[:3] == [16, 8, 4] and max(asked[3:]) <= 3
