"""A scripted hostile party with its own key: raw transactions, signed peer requests, crafted blobs.

``HostileMember`` is what a member (or, before it is admitted, an outsider) can do with nothing
but its private key, the chain's RPC and the other nodes' public endpoints: every transaction
is signed and sent raw (``hostile_chain.send_raw``: no preflight of ours filters it), every
peer request is signed with the same key (``RequestSigner``), and blobs are built chunk by
chunk, so a tree can lie about its spans or repeat a leaf. Tests drive it from the test process
against real node processes; protocol attacks (a copied update, a silent committee seat, a
hijacked proposal) can be added as methods next to the ones here.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from backend.ledger.contracts import draw_commitment, score_commitment
from backend.ledger.errors import decode_revert
from backend.ledger.resources import Deployment, JobSpec
from backend.peers.signing import HEADER_ADDRESS, RequestSigner
from backend.swarm.client import PUSH_PATH, PeerClient
from backend.swarm.errors import ChunkNotFound, SwarmError
from backend.swarm.joiner import join
from backend.swarm.pipeline import store_stream
from backend.swarm.reference import Reference, chunk_address, encode_span, is_valid_chunk
from backend.swarm.wire import batch_digest, decode_addresses, encode_batch
from devnet.consortium import overlay_of, public_key
from tests.adversarial.hostile_chain import RAW_GAS, encode_raw, send_raw

MiB = 1 << 20
BRANCHES = MiB // 32  # references in one full intermediate chunk (unencrypted)
KEY_PATH = "/api/jobs/peer/update-key"  # backend.jobs.sealed.key_requests.KEY_PATH

Chunk = tuple[bytes, bytes]


@dataclass(frozen=True)
class Peer:
    """A node as any member sees it: its endpoint and its chain address (the signed receiver)."""

    url: str
    address: str


class _ListSink:
    def __init__(self) -> None:
        self.chunks: list[Chunk] = []

    def put(self, address: bytes, data: bytes) -> None:
        self.chunks.append((address, bytes(data)))


def framed(span: int, payload: bytes) -> Chunk:
    """A chunk as stored: its span, its payload, and its address (the hash of both)."""
    data = encode_span(span) + payload
    return chunk_address(data), data


def blob_chunks(data: bytes) -> tuple[bytes, list[Chunk]]:
    """An honest chunk tree of ``data`` (unencrypted, as job blobs are): root address, chunks."""
    sink = _ListSink()
    reference = store_stream(io.BytesIO(data), sink, encrypt=False)
    return reference.entry(), sink.chunks


def span_bomb() -> tuple[bytes, list[Chunk]]:
    """A 1 TiB blob from 3 MiB of chunks: a root listing one 32 GiB subtree 32768 times, which
    lists one 1 MiB leaf 32768 times. Every span is honest; only the size is hostile."""
    leaf_address, leaf = framed(MiB, b"A" * MiB)
    inner_address, inner = framed(BRANCHES * MiB, leaf_address * BRANCHES)
    root_address, root = framed(BRANCHES * BRANCHES * MiB, inner_address * BRANCHES)
    return root_address, [(leaf_address, leaf), (inner_address, inner), (root_address, root)]


def lying_span(claimed: int = 100) -> tuple[bytes, list[Chunk]]:
    """A root that claims ``claimed`` bytes but lists 32768 leaves of 1 MiB (32 GiB)."""
    leaf_address, leaf = framed(MiB, b"B" * MiB)
    root_address, root = framed(claimed, leaf_address * BRANCHES)
    return root_address, [(leaf_address, leaf), (root_address, root)]


@dataclass
class HostileMember:
    """One hostile party: a key, the chain it sends to, the contracts it calls."""

    w3: Web3
    deployment: Deployment
    account: LocalAccount = field(default_factory=Account.create)
    sent: list[dict[str, Any]] = field(default_factory=list)  # every receipt, for the report
    # job -> the draw secret committed at join (a fresh random one each: this party keeps it)
    draw_secrets: dict[int, bytes] = field(default_factory=dict)
    # one sender at a time: threads of one party would otherwise pick the same nonce
    _sending: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def address(self) -> str:
        return self.account.address

    @property
    def signer(self) -> RequestSigner:
        return RequestSigner(bytes(self.account.key))

    # ------------------------------------------------------------------ raw transactions

    def call(self, contract: str, function: str, *, gas: int = RAW_GAS, **args: Any) -> dict:
        """Send ``contract.function(**args)`` raw; the receipt (status 0: the contract refused)."""
        data = encode_raw(contract, function, **args)
        with self._sending:
            receipt = send_raw(self.w3, self.account, self.deployment.address(contract), data, gas=gas)
        self.sent.append({"call": f"{contract}.{function}", "status": int(receipt["status"])})
        return receipt

    def call_many(self, contract: str, function: str, argsets: Iterable[dict[str, Any]]) -> list[dict]:
        """Send a burst without waiting between transactions (a flood), then every receipt."""
        with self._sending:
            return self._call_many(contract, function, argsets)

    def _call_many(self, contract: str, function: str, argsets: Iterable[dict[str, Any]]) -> list[dict]:
        base = self.w3.eth.get_block("latest").get("baseFeePerGas") or 0
        nonce = self.w3.eth.get_transaction_count(self.address, "pending")
        hashes = []
        for offset, args in enumerate(argsets):
            tx = {
                "to": self.deployment.address(contract),
                "data": encode_raw(contract, function, **args),
                "gas": RAW_GAS,
                "nonce": nonce + offset,
                "chainId": self.w3.eth.chain_id,
                "value": 0,
                "maxFeePerGas": 4 * base + 10**9,
                "maxPriorityFeePerGas": 10**9,
            }
            hashes.append(self.w3.eth.send_raw_transaction(self.account.sign_transaction(tx).raw_transaction))
        receipts = [dict(self.w3.eth.wait_for_transaction_receipt(h, timeout=120)) for h in hashes]
        self.sent.extend({"call": f"{contract}.{function}", "status": int(r["status"])} for r in receipts)
        return receipts

    def register_node(self, name: bytes | str, endpoint: bytes | str) -> dict:
        return self.call(
            "NodeRegistry",
            "registerNode",
            name=name,
            endpoint=endpoint,
            pubkey=public_key(self.account),
            overlay=overlay_of(self.address),
        )

    def register_dataset(
        self,
        samples: int,
        privacy_cap: int = 50_000_000,
        *,
        schema_hash: bytes | str | None = None,
        disjoint: bool = True,
    ) -> int:
        """A dataset of nothing (random commitment and reference) claiming ``samples``, of
        ``schema_hash`` (an honest dataset's, so that it counts among those a job of that schema can
        take; random by default); declared disjoint by default (a budget source of its own)."""
        if isinstance(schema_hash, str):
            schema_hash = bytes.fromhex(schema_hash.removeprefix("0x"))
        receipt = self.call(
            "DataRegistry",
            "registerDataset",
            commitment=os.urandom(32),
            swarmRef=os.urandom(32),
            schemaHash=schema_hash or os.urandom(32),
            samples=samples,
            privacyCap=privacy_cap,
            disjoint=disjoint,
            initialSpend=0,  # no release counted for its (claimed) size
        )
        assert receipt["status"] == 1, receipt
        # DatasetRegistered(uint256 indexed datasetId, ...): the id is the first indexed topic
        log = next(entry for entry in receipt["logs"] if len(entry["topics"]) > 1)
        return int.from_bytes(bytes(log["topics"][1]), "big")

    def join(self, job_id: int, dataset_id: int, secret: bytes | None = None) -> dict:
        """Join committing to a draw secret (a fresh random one unless given), kept for the reveal."""
        secret = os.urandom(32) if secret is None else secret
        self.draw_secrets[job_id] = secret
        commitment = draw_commitment(job_id, self.address, secret)
        return self.call(
            "FederatedLearning", "join", jobId=job_id, datasetId=dataset_id, drawCommitment=commitment
        )

    def reveal_draw(self, job_id: int, secret: bytes | None = None) -> dict:
        """revealDrawSecret with the secret committed at join (or ``secret``, to show a wrong one)."""
        secret = self.draw_secrets[job_id] if secret is None else secret
        return self.call("FederatedLearning", "revealDrawSecret", jobId=job_id, secret=secret)

    def spend(self, job_id: int, round_: int, amount: int, *, kind: int = 0, steps: int = 0) -> dict:
        """spendPrivacy: ``kind`` 0 an update, 1 committee scores, 2 a withheld update."""
        return self.call(
            "FederatedLearning",
            "spendPrivacy",
            jobId=job_id,
            round=round_,
            amount=amount,
            kind=kind,
            steps=steps,
        )

    def submit_update(
        self,
        job_id: int,
        round_: int,
        reference: bytes,
        samples: int,
        *,
        content_hash: bytes | None = None,
        spend: int = 0,
    ) -> dict:
        """An update of ``reference`` claiming ``samples``; its content hash is random unless given
        (a copier names another trainer's); ``spend``: the privacy spend folded in (0: none)."""
        return self.call(
            "FederatedLearning",
            "submitUpdate",
            **self._update_args(job_id, round_, reference, samples, content_hash, spend),
        )

    @staticmethod
    def _update_args(job_id, round_, reference, samples, content_hash, spend) -> dict[str, Any]:
        return dict(
            jobId=job_id,
            round=round_,
            modelRef=reference,
            contentHash=content_hash if content_hash is not None else os.urandom(32),
            samples=samples,
            spend=spend,
        )

    def refusal(
        self, contract: str, function: str, *, at_block: int | None = None, **args: Any
    ) -> str | None:
        """The custom error the contract answers ``function(**args)`` from this key with, read by an
        eth_call on the latest block or on ``at_block`` (None: it would be accepted). The same call
        sent raw is what the test counts; this names why it fails."""
        data = encode_raw(contract, function, **args)
        call = {"from": self.address, "to": self.deployment.address(contract), "data": "0x" + data.hex()}
        block = "latest" if at_block is None else hex(at_block)
        answer = self.w3.provider.make_request("eth_call", [call, block])
        error = answer.get("error")
        if not error:
            return None
        revert = error.get("data")
        if isinstance(revert, dict):  # some nodes nest it
            revert = revert.get("data")
        if not isinstance(revert, str) or len(revert) < 10:
            return f"reverted: {error.get('message', '')}"
        return decode_revert(bytes.fromhex(revert.removeprefix("0x"))).error

    def commit_scores(
        self, job_id: int, round_: int, scores: dict[str, int], base_score: int, salt: bytes
    ) -> dict:
        """commitScores with the commitment an honest member would send for these scores."""
        commitment = score_commitment(job_id, round_, self.address, scores, base_score, salt)
        return self.call(
            "FederatedLearning", "commitScores", jobId=job_id, round=round_, commitment=commitment
        )

    @staticmethod
    def reveal_args(
        job_id: int, round_: int, scores: dict[str, int], base_score: int, salt: bytes
    ) -> dict[str, Any]:
        return dict(
            jobId=job_id,
            round=round_,
            trainers=list(scores),
            scores=list(scores.values()),
            baseScore=base_score,
            salt=salt,
        )

    def reveal_scores(
        self, job_id: int, round_: int, scores: dict[str, int], base_score: int, salt: bytes
    ) -> dict:
        return self.call(
            "FederatedLearning", "revealScores", **self.reveal_args(job_id, round_, scores, base_score, salt)
        )

    def vote_model(self, job_id: int, round_: int, reference: bytes, model_hash: bytes) -> dict:
        """voteGlobalModel for the pair (``model_hash``, ``reference``), as any aggregating member."""
        return self.call(
            "FederatedLearning",
            "voteGlobalModel",
            jobId=job_id,
            round=round_,
            modelRef=reference,
            modelHash=model_hash,
        )

    def packed_scores(self, job_id: int, round_: int, index: int) -> int:
        """The revealed scores of the round's update ``index`` as anyone reads them (getUpdate)."""
        data = encode_raw("FederatedLearning", "getUpdate", jobId=job_id, round=round_, index=index)
        raw = self.w3.eth.call({"to": self.deployment.address("FederatedLearning"), "data": data})
        return int.from_bytes(bytes(raw)[32:64], "big")

    def propose_job(self, spec: JobSpec) -> tuple[dict, int | None]:
        """Propose ``spec`` as is; the receipt and the new job's id (None if refused)."""
        receipt = self.call("FederatedLearning", "proposeJob", spec=spec.as_abi())
        if receipt["status"] != 1:
            return receipt, None
        log = next(entry for entry in receipt["logs"] if len(entry["topics"]) > 1)
        return receipt, int.from_bytes(bytes(log["topics"][1]), "big")

    def job_state(self, job_id: int, *, at_block: int | None = None) -> dict[str, Any]:
        """getJob as a dict (status, round, phase, maxSpendPerRound, ...), read with a plain call on
        the latest block or on ``at_block``."""
        from backend.ledger.artifacts import load_artifact

        abi = load_artifact("FederatedLearning").abi
        contract = self.w3.eth.contract(address=self.deployment.address("FederatedLearning"), abi=abi)
        getter = next(i for i in abi if i["type"] == "function" and i["name"] == "getJob")
        names = [c["name"] for c in getter["outputs"][0]["components"]]
        block = "latest" if at_block is None else at_block
        return dict(zip(names, contract.functions.getJob(job_id).call(block_identifier=block), strict=True))

    # ------------------------------------------------------------------ signed peer requests

    def peer_post(
        self,
        peer: Peer,
        path: str,
        body: bytes,
        *,
        receiver: str | None = None,
        digest: str | None = None,
        timeout: float = 60,
    ) -> requests.Response:
        """A request signed with this key, for ``receiver`` (default: the peer it is sent to)."""
        headers = self.signer.headers("POST", path, body, receiver=receiver or peer.address, digest=digest)
        return requests.post(
            peer.url + path, data=body, headers=headers, timeout=timeout, allow_redirects=False
        )

    def push(self, peer: Peer, chunks: Sequence[Chunk]) -> set[bytes]:
        """Push chunks (as any member's upload would); the addresses the peer acknowledged."""
        acked: set[bytes] = set()
        batch: list[Chunk] = []
        size = 0
        for chunk in list(chunks) + [None]:  # type: ignore[list-item]
            if chunk is not None:
                batch.append(chunk)
                size += len(chunk[1])
            if batch and (chunk is None or size >= 6 * MiB):
                body = encode_batch(batch)
                response = self.peer_post(peer, PUSH_PATH, body, digest=batch_digest(body))
                response.raise_for_status()
                acked |= set(decode_addresses(response.content))
                batch, size = [], 0
        return acked

    def store_everywhere(self, peers: Sequence[Peer], chunks: Sequence[Chunk]) -> None:
        """Put a crafted tree on every node, so each one finds it locally (no retrieval needed)."""
        for peer in peers:
            acked = self.push(peer, chunks)
            missing = {address for address, _ in chunks} - acked
            assert not missing, f"{peer.url} did not take {len(missing)} chunks"


# ----------------------------------------------------------------------------- a hostile endpoint


# A key server's answer for (job, round, trainer) to a requester: the key's hex, or None (404).
KeyPolicy = Callable[[int, int, str, str], "str | None"]


class KeyServer:
    """A hostile party's registered endpoint: it answers the peer key requests of sealed updates
    (``KEY_PATH``) as its ``policy`` decides, and 404 to everything else. By default it hands out
    the key it was given for (job, round, trainer) to anyone (an honest trainer does the same once
    training is over); a policy may answer differently per requester (the two-key blob of issue 32).
    The requester is the address its signed request names (unchecked: only its answer matters)."""

    def __init__(self) -> None:
        self.keys: dict[tuple[int, int, str], bytes] = {}
        self.policies: dict[tuple[int, int, str], KeyPolicy] = {}
        self.asked: list[tuple[int, int, str, str]] = []  # (job, round, trainer, requester)
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 4096))
                key = None
                if self.path == KEY_PATH:
                    try:
                        asked = json.loads(body)
                        key = server.answer(
                            int(asked["job"]),
                            int(asked["round"]),
                            str(asked["trainer"]),
                            str(self.headers.get(HEADER_ADDRESS, "")),
                        )
                    except (ValueError, KeyError, TypeError):
                        key = None
                status, answer = (200, {"key": key}) if key else (404, {"detail": "no key here"})
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def hold(
        self, job_id: int, round_: int, trainer: str, key: bytes, policy: KeyPolicy | None = None
    ) -> None:
        """Serve ``key`` for the trainer's update of the round (or whatever ``policy`` answers)."""
        with self._lock:
            self.keys[(job_id, round_, trainer.lower())] = key
            if policy is not None:
                self.policies[(job_id, round_, trainer.lower())] = policy

    def answer(self, job_id: int, round_: int, trainer: str, requester: str) -> str | None:
        at = (job_id, round_, trainer.lower())
        with self._lock:
            self.asked.append((*at, requester.lower()))
            policy, key = self.policies.get(at), self.keys.get(at)
        if policy is not None:
            return policy(job_id, round_, trainer.lower(), requester.lower())
        return key.hex() if key is not None else None

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def sealed(plaintext: bytes) -> tuple[bytes, list[Chunk], bytes, str]:
    """An update sealed as an honest trainer seals it (backend.jobs.sealed.envelope): the blob's
    root reference, its chunks, the key, and the plaintext's content hash (what goes on chain)."""
    from backend.jobs.sealed import envelope
    from fl_node.codec import content_hash

    blob, key = envelope.seal(plaintext)
    root, chunks = blob_chunks(blob)
    return root, chunks, key, content_hash(plaintext)


# ----------------------------------------------------------------------------- reading as a member


class PeerSource:
    """A chunk source over the peers' fetch endpoint, signed with one member's key: each chunk is
    asked of the peers in turn and kept only if it hashes to its address (``joiner.ChunkSource``)."""

    def __init__(self, member: HostileMember, peers: Sequence[Peer]) -> None:
        self.clients = [
            PeerClient(p.url, member.signer, receiver=p.address, allow_private=True) for p in peers
        ]

    def get_many(self, addresses: Sequence[bytes]) -> Iterable[bytes]:
        found: dict[bytes, bytes] = {}
        for client in self.clients:
            wanted = [a for a in addresses if a not in found]
            if not wanted:
                break
            try:
                answer = client.fetch(wanted)
            except SwarmError:
                continue
            found.update((a, d) for a, d in answer.items() if is_valid_chunk(a, d))
        for address in addresses:
            if address not in found:
                raise ChunkNotFound(address, "no peer returned a valid copy")
            yield found[address]

    def close(self) -> None:
        for client in self.clients:
            client.close()


def read_blob(member: HostileMember, peers: Sequence[Peer], reference: str, *, max_bytes: int) -> bytes:
    """A blob as any member reads it from the honest nodes (unencrypted job blobs)."""
    source = PeerSource(member, peers)
    try:
        return b"".join(bytes(p) for p in join(Reference.parse(reference), source, max_bytes=max_bytes))
    finally:
        source.close()


class NoKey(Exception):
    """No holder gave a key that opens the sealed update (a participant's reader gives up)."""


def update_plaintext(
    member: HostileMember,
    peers: Sequence[Peer],
    job_id: int,
    round_: int,
    update: dict,
    *,
    max_bytes: int,
    known: KeyServer | None = None,
) -> bytes:
    """An update's bytes as a participant reads it once the round's training is over: the sealed
    blob (backend.jobs.sealed: every update is one), opened with a key from ``known`` (a hostile
    party's own) or asked of the peers by a signed request, checked against the key the blob
    commits to. ``update``: the UpdateSubmitted event's arguments. Raises WrongContent (the
    committed key opens it wrong, or it is not a sealed update: the trainer's fault, final) or
    NoKey (no holder gave the committed key)."""
    from backend.jobs.sealed import envelope

    blob = read_blob(member, peers, update["modelRef"], max_bytes=max_bytes + envelope.OVERHEAD)
    if not blob.startswith(envelope.MAGIC):
        raise envelope.WrongContent("not a sealed update")
    body = json.dumps({"job": job_id, "round": round_, "trainer": update["trainer"]}).encode()

    def keys() -> Iterable[tuple[str, str]]:
        own = known.answer(job_id, round_, update["trainer"], member.address) if known else None
        if own:
            yield "own", own
        for peer in peers:
            answer = member.peer_post(peer, KEY_PATH, body, timeout=30)
            if answer.status_code != 200:
                refused.append(f"{peer.address}: {answer.status_code} {answer.text[:120]}")
                continue
            yield peer.address, answer.json()["key"]

    refused: list[str] = []
    for holder, key in keys():
        try:
            return envelope.unseal(blob, bytes.fromhex(key), update["contentHash"])
        except envelope.KeyMismatch as exc:  # the holder's error: ask the next one
            refused.append(f"{holder}: {exc}")
    raise NoKey(f"no holder gave the key of {update['trainer']}'s update: {refused}")
