"""Sealed updates (backend.jobs.sealed): nobody reads a trainer's update before the training deadline.

The crypto and the request bounds alone first; then one round on an in-process chain with seven
node identities (three committee members, two honest trainers, a hostile trainer, an outsider
registered in the consortium but not in the job), where a curious member asks for keys with raw
signed peer requests, the hostile trainer submits a copy of an honest sealed blob under a hash of
its own, the honest trainer's submit fails once (an RPC outage) and is retried, and a reader gets a
key from a relay with its trainer gone, and a holder whose mirror lags its own submit answers
from the contract. Last, a round's keys asked for all at once from real HTTP holders, some hostile.
"""

from __future__ import annotations

import json
import os

import pytest
from django.test import Client
from jobs_helpers import acting_as, add_dataset, digits_parts, draw_committee, job_request, make_nodes

from backend.jobs import blobs, chain
from backend.jobs.driver.memory import DriverMemory
from backend.jobs.models import UpdateKey
from backend.jobs.sealed import envelope, key_gathering, key_release, key_requests, key_store, reader
from fl_node.codec import content_hash

pytestmark = pytest.mark.django_db


# ----------------------------------------------------------------------------------------- crypto
def test_a_sealed_update_opens_only_under_its_key_to_its_hash():
    update = os.urandom(5000)
    blob, key = envelope.seal(update)
    assert len(key) == envelope.KEY_BYTES and len(blob) == len(update) + envelope.OVERHEAD
    assert update not in blob
    assert envelope.unseal(blob, key, "0x" + content_hash(update)) == update
    assert envelope.unseal(blob, key, bytes.fromhex(content_hash(update))) == update  # an event's bytes32
    again, other_key = envelope.seal(update)
    assert again != blob and other_key != key  # fresh key and nonce every time
    with pytest.raises(envelope.KeyMismatch, match="commits to"):  # a holder's error, not the trainer's
        envelope.unseal(blob, other_key, content_hash(update))
    with pytest.raises(envelope.WrongContent):
        envelope.unseal(blob, key, content_hash(b"another update"))
    tampered = bytearray(blob)
    tampered[-40] ^= 1
    with pytest.raises(envelope.WrongContent, match="does not open"):
        envelope.unseal(bytes(tampered), key, content_hash(update))
    for bad_key in (b"", key[:16], key + b"\0"):
        with pytest.raises(envelope.KeyMismatch, match="bytes"):
            envelope.unseal(blob, bad_key, content_hash(update))
    for bad_blob in (b"", b"DFS1" + bytes(10), b"DFS1" + blob[4:], update):
        with pytest.raises(envelope.WrongContent, match="not a sealed update"):
            envelope.unseal(bad_blob, key, content_hash(update))
    assert issubclass(envelope.SealError, blobs.BlobMismatch)  # scored 0 like any altered update


def _two_key_blob(good: bytes, other: bytes) -> tuple[bytes, bytes, bytes]:
    """The issue-32 attack on a sealed update: one blob meant to open to ``good`` under the key the
    trainer gives the scorers and to ``other`` under the key it gives everyone else. With a
    key-committing header a blob names one key; the trainer can at best commit to one key and
    encrypt under the other. Returns (blob, the committed key, the key it encrypted under)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    committed, used = os.urandom(32), os.urandom(32)
    header = envelope.MAGIC + envelope.key_commitment(committed)
    nonce = os.urandom(envelope.NONCE_BYTES)
    return header + nonce + AESGCM(used).encrypt(nonce, good, header), committed, used


def test_a_blob_opens_under_one_key_only_so_every_node_reaches_the_same_verdict():
    good, other = os.urandom(3000), os.urandom(3000)
    blob, committed, used = _two_key_blob(good, other)
    expected = content_hash(good)
    # the key it encrypted under is not the committed one: refused as a holder's error everywhere
    with pytest.raises(envelope.KeyMismatch):
        envelope.unseal(blob, used, expected)
    # the committed key does not open it: the trainer's fault, final
    with pytest.raises(envelope.WrongContent):
        envelope.unseal(blob, committed, expected)
    # the same verdicts for a large blob opened in place (the reader's path above the cache size)
    from fl_node.codec import OwnedBuffer

    for key, error in ((used, envelope.KeyMismatch), (committed, envelope.WrongContent)):
        owned = OwnedBuffer(blob)
        with pytest.raises(error):
            envelope.unseal(owned, key, expected)


@pytest.mark.parametrize(
    "body",
    [
        b"x" * (key_release.MAX_REQUEST_BYTES + 1),
        b"not json",
        b"[1, 2]",
        b'{"job": true, "round": 1, "trainer": "0x' + b"a" * 40 + b'"}',
        b'{"job": -1, "round": 1, "trainer": "0x' + b"a" * 40 + b'"}',
        b'{"job": 1, "round": 18446744073709551616, "trainer": "0x' + b"a" * 40 + b'"}',
        b'{"job": 1, "round": 1, "trainer": "0x' + b"a" * 39 + b'"}',
        b'{"job": 1, "round": 1, "trainer": 5}',
        b"\xff\xfe",
    ],
)
def test_a_key_request_is_bounded_before_anything_is_looked_up(body):
    with pytest.raises(ValueError):
        key_release.parse_request(body)


# ------------------------------------------------------------------------------- one sealed round
def _signed_post(account, receiver: str, job_id: int, round_: int, trainer: str):
    from backend.peers.signing import RequestSigner

    body = json.dumps({"job": job_id, "round": round_, "trainer": trainer}).encode()
    headers = RequestSigner(bytes(account.key)).headers(
        "POST", key_requests.KEY_PATH, body, receiver=receiver
    )
    return Client().post(key_requests.KEY_PATH, data=body, content_type="application/json", headers=headers)


def _tick(node, monkeypatch, kinds=None):
    from backend.jobs.driver import actions, agent

    def dispatch(due):
        if kinds is None or due.kind in kinds:
            actions.run(node.ctx, due)

    with acting_as(node, monkeypatch):
        agent.tick(node.ctx, dispatch)


def test_a_sealed_round_with_a_curious_member_a_copier_and_an_outage(operator_client, monkeypatch, settings):
    from backend.datasets.models import PrivacyRelease
    from backend.jobs.driver import committee, state
    from backend.ledger import models as mirror
    from backend.ledger.abi import EventDecoder
    from backend.swarm import factory

    nodes = make_nodes(7, seed="sealed-updates")
    outsider = nodes[6]
    parts = digits_parts(6)
    datasets = [
        add_dataset(n, monkeypatch, x, y, name=f"digits-{i}")
        for i, (n, (x, y)) in enumerate(zip(nodes, parts, strict=False))  # the outsider has none
    ]
    request = job_request(datasets[0].pk, rounds=1, committee_size=3, top_k=2, min_trainers=2)
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post("/api/jobs", request, format="json")
        assert response.status_code == 201, response.content
        job_id = response.json()["id"]
    for node, dataset in zip(nodes[:6], datasets, strict=True):
        with acting_as(node, monkeypatch):
            joined = operator_client.post(f"/api/jobs/{job_id}/join", {"dataset": dataset.pk}, format="json")
            assert joined.status_code == 200, joined.content
    with acting_as(nodes[0], monkeypatch):
        started = operator_client.post(f"/api/jobs/{job_id}/start", {}, format="json")
        assert started.status_code == 200, started.content
    draw_committee(nodes, job_id)
    chain.sync_mirror(nodes[0].ctx)
    job = mirror.Job.objects.get(job_id=job_id)
    seats = set(state.seats(job, 1))
    members = [n for n in nodes[:6] if n.ctx.address in seats]
    honest, victim, copier = [n for n in nodes[:6] if n.ctx.address not in seats]
    assert len(members) == 3

    # The honest trainer's first submit meets an RPC outage: nothing reaches the chain.
    real_submit = chain.submit_update
    failed = []

    def submit_once_failing(ctx, *args, **kwargs):
        if ctx.address == honest.ctx.address and not failed:
            failed.append(kwargs.get("spend"))
            raise ConnectionError("the chain's RPC endpoint is unreachable")
        return real_submit(ctx, *args, **kwargs)

    monkeypatch.setattr(chain, "submit_update", submit_once_failing)
    for node in (victim, honest):
        _tick(node, monkeypatch, {"train"})
    assert failed and failed[0] > 0, "the spend travels with the submit"
    chain.sync_mirror(nodes[0].ctx)
    victims = job.updates.get(round=1, trainer=victim.ctx.address)
    sealed_blob = blobs.get(victim.ctx, victims.reference)
    assert sealed_blob.startswith(envelope.MAGIC)

    # Before the deadline (two of three updates in) a participant gets no key, over the peer API.
    settings.DEFL_PEERS = [f"{n.ctx.address}@http://n{i}.test" for i, n in enumerate(nodes)]
    factory.peer_directory.cache_clear()
    receiver = factory.own_address()
    with acting_as(victim, monkeypatch):
        early = _signed_post(copier.account, receiver, job_id, 1, victim.ctx.address)
    assert early.status_code == 409 and "still training" in early.json()["detail"], early.content

    # The copier submits the victim's sealed blob under a hash of its own (it cannot read the
    # update, and its plaintext hash is refused as a duplicate).
    with pytest.raises(chain.ledger_errors.DuplicateContent):
        real_submit(copier.ctx, job_id, 1, victims.reference, victims.content_hash, 1, spend=1)
    real_submit(copier.ctx, job_id, 1, victims.reference, "0x" + os.urandom(32).hex(), 1, spend=1)

    # The honest node restarts (its memory is gone); the retry submits the same sealed update,
    # stored before the outage: one release, charged once, locally and on chain.
    honest.ctx.memory.clear()
    _tick(honest, monkeypatch, {"train"})
    chain.sync_mirror(nodes[0].ctx)
    honest_dataset = state.my_dataset(job, honest.ctx.address)
    releases = PrivacyRelease.objects.filter(dataset_id=honest_dataset.pk, job=str(job_id), round=1)
    assert [(r.kind, r.status) for r in releases] == [("dp_sgd", PrivacyRelease.Status.RELEASED)]
    spent = nodes[0].ctx.ledger.data.privacy_spent_by_job(int(honest_dataset.onchain_id), job_id)
    assert spent == releases.get().micro_epsilon or spent == max(releases.get().micro_epsilon, 1)
    assert not honest.ctx.memory.trainer.waiting
    # No spendPrivacy of a trainer: each spend is in its update's own transaction.
    client = nodes[0].ctx.ledger.client
    deployment = nodes[0].ctx.ledger.deployment
    contracts = [deployment.address("FederatedLearning"), deployment.address("DataRegistry")]
    logs = client.get_logs(contracts, 0, client.block_number())
    events = [e for e in map(EventDecoder().decode, logs) if e is not None and e.args.get("jobId") == job_id]
    submits = {e.tx_hash for e in events if e.name == "UpdateSubmitted"}
    spends = [e for e in events if e.name == "PrivacySpent"]
    assert len(submits) == len(spends) == 3 and {e.tx_hash for e in spends} == submits

    # Training is over (every update is in): a participant gets the key; an outsider does not.
    with acting_as(victim, monkeypatch):
        outside = _signed_post(outsider.account, receiver, job_id, 1, victim.ctx.address)
        inside = _signed_post(copier.account, receiver, job_id, 1, victim.ctx.address)
        unknown = _signed_post(copier.account, receiver, job_id, 1, copier.ctx.address)
    assert outside.status_code == 403 and "not a participant" in outside.json()["detail"], outside.content
    assert unknown.status_code == 404, unknown.content
    assert inside.status_code == 200, inside.content
    key = bytes.fromhex(inside.json()["key"])
    assert content_hash(
        envelope.unseal(sealed_blob, key, victims.content_hash)
    ) == victims.content_hash.removeprefix("0x")
    settings.DEFL_PEERS = []
    factory.peer_directory.cache_clear()
    # The copier serves that key for its copy: it opens the blob, but not to the copier's hash.
    copy = job.updates.get(round=1, trainer=copier.ctx.address)
    UpdateKey.objects.create(
        node=copier.ctx.address,
        job_id=job_id,
        round=1,
        trainer=copier.ctx.address,
        reference=copy.reference,
        content_hash=copy.content_hash,
        key=key.hex(),
        own=True,
    )

    # The committee scores: the copy 0, the honest updates read with their keys.
    for _ in range(3):
        for member in members:
            _tick(member, monkeypatch, {"score"})
    commitments = mirror.ScoreCommitment.objects.filter(job_id=job_id, round=1)
    assert commitments.count() == 3
    for committed in commitments:
        scores = dict(committed.scores)
        assert scores[copier.ctx.address] == 0, scores
        assert scores[victim.ctx.address] > 0 and scores[honest.ctx.address] > 0, scores
        # Each member keeps the keys it obtained (checked), and relays them.
        assert {victim.ctx.address.lower(), honest.ctx.address.lower()} <= key_store.keys_held(
            committed.node, job_id, 1
        )
    assert committee.key_deadline(chain.job_state(nodes[0].ctx, job_id)) > 0

    # The victim goes away (its node and its keys): a reader gets the key from a relay.
    UpdateKey.objects.filter(node=victim.ctx.address).delete()
    honest.ctx.memory.blobs.clear()
    UpdateKey.objects.filter(node=honest.ctx.address, trainer=victim.ctx.address).delete()
    update = reader.read_update(honest.ctx, job_id, 1, victims, max_bytes=len(sealed_blob))
    assert content_hash(update) == victims.content_hash.removeprefix("0x")
    assert victim.ctx.address.lower() in key_store.keys_held(honest.ctx.address, job_id, 1)

    # A holder whose mirror lags its own submit (its update not indexed yet) answers from the
    # contract: the trainer on chain for the held key's content hash in that round.
    own = dict(node=honest.ctx.address, job_id=job_id, round=1, trainer=honest.ctx.address)
    job.updates.filter(round=1, trainer=honest.ctx.address).delete()
    given = key_release.answer(
        honest.ctx, honest.ctx.address, copier.ctx.address, job_id, 1, honest.ctx.address
    )
    assert given == UpdateKey.objects.get(**own).key
    # A held key whose hash the chain does not record for that trainer stays refused.
    UpdateKey.objects.filter(**own).update(content_hash="0x" + os.urandom(32).hex())
    with pytest.raises(key_release.KeyRefused) as refused:
        key_release.answer(honest.ctx, honest.ctx.address, copier.ctx.address, job_id, 1, honest.ctx.address)
    assert refused.value.status == 404


# ------------------------------------------------------------------ a round's keys, all at once
class _Holders:
    """Real HTTP endpoints of key holders, one path per holder, each answering as told: ``good``
    answers only once every good holder has been asked (a barrier: asked one after another, the
    first would wait alone and answer 503), ``wrong`` a key that opens the blob to other content,
    ``refuse`` 409, ``silent`` never within the read timeout, ``huge`` an answer past the bound."""

    def __init__(self, behaviours: dict[str, tuple[str, bytes]]):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.behaviours = behaviours  # path prefix -> (behaviour, key)
        goods = sum(1 for kind, _ in behaviours.values() if kind == "good")
        self.barrier = threading.Barrier(goods, timeout=3.0)
        self.release = threading.Event()
        holders = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                kind, key = holders.behaviours[self.path.split("/")[1]]
                status, body = 200, json.dumps({"key": key.hex()}).encode()
                if kind == "good":
                    try:
                        holders.barrier.wait()
                    except threading.BrokenBarrierError:
                        status, body = 503, b'{"detail": "asked alone"}'
                elif kind == "refuse":
                    status, body = 409, b'{"detail": "still training"}'
                elif kind == "silent":
                    holders.release.wait(10)
                elif kind == "huge":
                    body = b'{"key": "' + b"0" * key_requests.MAX_ANSWER_BYTES + b'"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, prefix: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{prefix}"

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_rounds_keys_are_asked_for_at_once_and_bad_holders_cost_one_timeout(monkeypatch, settings):
    from types import SimpleNamespace

    from eth_account import Account

    from backend.jobs.context import peer_access
    from backend.swarm import factory
    from backend.swarm.factory import node_swarm

    account = Account.create()
    ctx = SimpleNamespace(swarm=node_swarm(), address=account.address, memory=DriverMemory())
    monkeypatch.setattr(key_requests, "READ_TIMEOUT_S", 1.0)
    updates, behaviours, peers = {}, {}, []
    for kind in ("good", "good", "good", "wrong", "refuse", "silent", "huge", "garbage"):
        trainer = Account.create().address
        plaintext = os.urandom(3000)
        blob, key = envelope.seal(plaintext)
        claimed = content_hash(plaintext if kind != "wrong" else b"a copy under a hash of its own")
        reference = blobs.put(ctx, blob)
        updates[trainer] = (
            kind,
            SimpleNamespace(trainer=trainer, reference=reference, content_hash="0x" + claimed),
        )
        behaviours[f"h{len(behaviours)}"] = (kind, key if kind != "garbage" else os.urandom(32))
        peers.append(trainer)
    holders = _Holders(behaviours)
    by_kind = lambda kinds: {t for t, (k, _) in updates.items() if k in kinds}  # noqa: E731
    try:
        settings.DEFL_PEERS = [f"{t}@{holders.url(f'h{i}')}" for i, t in enumerate(peers)]
        settings.DEFL_ALLOW_PRIVATE_PEERS = True
        factory.peer_directory.cache_clear()
        ctx.peers = peer_access(bytes(account.key))  # this node asks the holders over the peer API
        missing = key_gathering.gather_keys(ctx, 77, 3, [u for _, u in updates.values()])
    finally:
        holders.close()
        settings.DEFL_PEERS = []
        factory.peer_directory.cache_clear()
    # Refused, silent past the read timeout, or an answer past the bound: missing, asked again later.
    assert {u.trainer for u in missing} == by_kind({"refuse", "silent", "huge"})
    assert not key_store.keys_held(ctx.address, 77, 3)  # nothing kept before a read checks it
    read = {}
    for trainer, (_, update) in updates.items():
        try:
            read[trainer] = reader.read_update(ctx, 77, 3, update, max_bytes=10_000, ask=False)
        except envelope.SealError as exc:
            read[trainer] = exc
        except reader.KeyUnavailable:
            read[trainer] = None
    # The three good holders answered only because all three were asked at the same time; their
    # keys open the blobs to the hashes on chain and are kept (and relayed) once read.
    assert key_store.keys_held(ctx.address, 77, 3) == {t.lower() for t in by_kind({"good"})}
    for trainer in by_kind({"good"}):
        assert content_hash(read[trainer]) == updates[trainer][1].content_hash.removeprefix("0x")
        kept = UpdateKey.objects.get(node=ctx.address, job_id=77, round=3, trainer=trainer)
        assert kept.content_hash == updates[trainer][1].content_hash and not kept.own
    # A key that opens the blob to other content: refused at once (scored 0), never kept.
    assert all(isinstance(read[t], envelope.WrongContent) for t in by_kind({"wrong"}))
    # A key that does not open the blob is not kept either: the holders are asked again.
    assert all(read[t] is None for t in by_kind({"garbage", "refuse", "silent", "huge"}))
    # Held keys are not asked for again: nothing goes out, nothing is missing.
    assert key_gathering.gather_keys(ctx, 77, 3, [updates[t][1] for t in by_kind({"good"})]) == []


def test_keys_asked_ahead_are_waited_for_not_asked_again(monkeypatch, settings):
    """The committee's agent asks for a round's keys as soon as its mirror shows the training over
    (key_gathering.ask_ahead); the score action's gather_keys then waits on those requests: each holder
    is asked once. An answer that comes after a restart cleared the node's memory is not kept.

    No clock: the holders answer once gather_keys waits on the requests (a probe around the
    concurrent.futures.wait it calls), and the restart's answers are awaited through callbacks
    registered after the node's own, which run in registration order."""
    import threading
    from concurrent.futures import wait
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    from eth_account import Account

    from backend.jobs.context import peer_access
    from backend.swarm import factory
    from backend.swarm.factory import node_swarm

    asked: list[str] = []
    keys: dict[str, bytes] = {}
    hold = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            holder = self.path.split("/")[1]
            asked.append(holder)
            assert hold.wait(60)  # answers travel while the agent goes on
            body = json.dumps({"key": keys[holder].hex()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    account = Account.create()
    ctx = SimpleNamespace(swarm=node_swarm(), address=account.address, memory=DriverMemory())
    updates, peers = [], []
    for i in range(3):
        trainer = Account.create().address
        plaintext = os.urandom(2000)
        blob, keys[f"h{i}"] = envelope.seal(plaintext)
        updates.append(
            SimpleNamespace(
                trainer=trainer, reference=blobs.put(ctx, blob), content_hash="0x" + content_hash(plaintext)
            )
        )
        peers.append(f"{trainer}@http://127.0.0.1:{server.server_address[1]}/h{i}")
    try:
        settings.DEFL_PEERS = peers
        settings.DEFL_ALLOW_PRIVATE_PEERS = True
        factory.peer_directory.cache_clear()
        ctx.peers = peer_access(bytes(account.key))
        assert key_gathering.ask_ahead(ctx, 77, 4, updates) == 3  # returns at once: nothing answered yet
        assert key_gathering.ask_ahead(ctx, 77, 4, updates) == 3  # the same three requests, not new ones
        in_flight = set(ctx.memory.sealed.asking.values())
        waited_on = []

        def answers_come_while_waited_for(futures, **options):
            waited_on.append(set(futures))
            hold.set()
            return wait(futures, **options)

        monkeypatch.setattr(key_gathering, "wait", answers_come_while_waited_for)
        assert key_gathering.gather_keys(ctx, 77, 4, updates) == []
        assert waited_on == [in_flight] and len(in_flight) == 3  # it waited on the requests asked ahead
        assert sorted(asked) == ["h0", "h1", "h2"]
        for update in updates:  # each offered key opens its blob to its hash, and is kept
            reader.read_update(ctx, 77, 4, update, max_bytes=10_000, ask=False)
        assert key_store.keys_held(ctx.address, 77, 4) == {u.trainer.lower() for u in updates}
        assert not ctx.memory.sealed.asking  # nothing left in flight

        hold.clear()
        key_gathering.ask_ahead(ctx, 77, 5, updates)  # round 5: asked, then the node restarts
        answered = []
        for future in ctx.memory.sealed.asking.values():  # after the node's own callback
            event = threading.Event()
            future.add_done_callback(lambda _future, event=event: event.set())
            answered.append(event)
        ctx.memory.clear()
        hold.set()
        assert len(answered) == 3 and all(event.wait(60) for event in answered)
        assert sorted(asked[3:]) == ["h0", "h1", "h2"]
        assert not ctx.memory.sealed.offers and not ctx.memory.sealed.asking
    finally:
        hold.set()
        server.shutdown()
        server.server_close()
        settings.DEFL_PEERS = []
        factory.peer_directory.cache_clear()
