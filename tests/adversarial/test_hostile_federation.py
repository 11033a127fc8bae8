"""A hostile member and a hostile outsider attack a running job of real node processes (issue 13).

Three honest organizations (org-a, org-b on MariaDB, org-c) run a 5-round DP job on anvil
with a committee of one (a development deployment). Every honest agent runs under an RLIMIT_AS of
VICTIM_LIMIT: the victim is whichever honest member sits on the committee of the round mallory
sends its 1 TiB update in. A fourth member, mallory (``HostileMember``: its own key, raw
transactions, signed peer requests), joins the job and attacks it from inside; an outsider
with a key no registry lists attacks from outside. Mallory's registered endpoint is a server
of ours that redirects pushes to an inner address and answers fetches without end.

Every committee is drawn on chain from all four participants (JobStarted, then each round's
RoundFinalized, uniformly: no ranking elects anyone), so any round's may seat mallory: then its
seat stays silent (a further attack). Seated to score, the round ends by its deadlines accepting
nothing; seated to aggregate, no model is fixed and the aggregation is skipped at its deadline.
Every defence below is still exercised in the rounds it trains in (its first update is the bomb).

While the job runs, every attack below is tried (each names its class in ATTACKS). Throughout,
a sampler asks every honest node for its health and its indexer's lag. Asserted: the job
finishes on every honest node with the same fixed global models as on chain (a round is skipped
only where the draw gave mallory its aggregating seat); mallory's updates are never accepted; each honest node's indexer passes every attack burst within CATCH_UP_S and
its lag stays below LAG_BOUND; every health probe is answered within HEALTH_TIMEOUT_S; the
rejected events are listed with reasons by ``GET /api/events``; the hostile jobs are declined
with a reason; no node process dies and the victim's peak memory stays under its limit; a
seat the draw gave mallory ends by the round's deadlines and keeps the previous model.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from eth_account import Account
from web3 import HTTPProvider, Web3

from backend.ledger.abi import EventDecoder
from backend.ledger.chains import ensure_funds
from backend.ledger.deployment import load_deployment
from backend.ledger.resources import JobSpec, JobStatus, RoundPhase
from backend.swarm.client import HAS_PATH, PUSH_PATH
from backend.swarm.wire import batch_digest, decode_addresses, encode_batch
from devnet.localnet import OPERATOR, TERMINAL, LocalFederation, NodeSpec
from fl_node.codec import content_hash
from fl_node.committee import draw_committee
from fl_node.job.config import DPConfig, JobConfig
from tests.adversarial.hostile_chain import craft_log, emit_as, event_args
from tests.adversarial.hostile_events_scenario import BAD_NAME
from tests.adversarial.hostile_member import (
    HostileMember,
    Peer,
    blob_chunks,
    framed,
    lying_span,
    span_bomb,
)
from tests.jobs.jobs_helpers import digits_parts

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(3000),
]

ROUNDS = 5
GiB = 1 << 30
VICTIM_LIMIT = 4 * GiB  # the victim's agent loads ~1 GiB; a 1 TiB bomb cannot fit, a job can
HEALTH_TIMEOUT_S = 30  # generous: 9 agents share 2 cores; the point is "answered", not "fast"
CATCH_UP_S = 240  # an indexer passes an attack burst's last block within this
LAG_BOUND = 600  # blocks; the largest burst is FLOOD events
FLOOD = 120
SAMPLES = 200  # mallory's claimed dataset size (and its updates' sample counts)

# The class each attack covers (named in the report of the test that checks it).
ATTACKS = {
    "outsider_bad_name": "outsider: malformed, oversized string in an event (registerNode, not UTF-8, 10 KB)",
    "emitted_refused_events": "outsider/old contract: events the indexer cannot decode or store",
    "unsigned_peer_request": "outsider: unauthenticated peer request",
    "outsider_signed_peer_request": "outsider: peer request signed by a non-member",
    "replayed_to_other_receiver": "member: replay of a signed request to another node",
    "oversized_peer_body": "outsider and member: memory exhaustion by a declared 200 MiB body",
    "slowloris": "member: slow bodies holding a node's threads",
    "login_brute_force": "outsider: online password guessing",
    "spend_huge_job_id": "member: spendPrivacy for a job id near 2^200",
    "spend_out_of_bounds": "member: spendPrivacy of 0 and of 2^64-1 on the live job",
    "config_span_bomb": "member: job config reference expanding to 1 TiB",
    "config_lying_span": "member: job config reference whose root lies about its span",
    "config_out_of_bounds": "member: job config with 10^9 hidden units and 10^9 epochs",
    "update_bombs": "member: update references that are a 1 TiB tree, garbage, a lying tree",
    # beyond the list
    "update_samples_above_dataset": "member: an update claiming 2^64-1 samples",
    "chunks_failing_their_hash": "member: pushed chunks whose address is not their hash",
    "event_flood": f"member: a flood of {FLOOD} cheap events with garbage wrapped keys",
    "hostile_endpoint": "member: its endpoint redirects pushes inward and streams fetches forever",
    "cancel_foreign_job": "member: cancels the honest job it joined (not its proposer)",
    "silent_committee_seat": "member: a committee seat the draw gave it, left silent (if drawn)",
}


# ----------------------------------------------------------------------------- mallory's endpoint


class _HostileEndpoint(http.server.BaseHTTPRequestHandler):
    """Mallory's registered endpoint: pushes are redirected to ``inner``; everything else is
    answered with a stream that never ends. ``inner`` records any request that reaches it."""

    inner = ""
    hits: list[str] = []
    streamed = 0

    def log_message(self, *_args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        type(self).hits.append("GET " + self.path)
        self._stream()

    def do_POST(self) -> None:  # noqa: N802
        type(self).hits.append("POST " + self.path)
        length = min(int(self.headers.get("Content-Length") or 0), 64 << 20)
        self.rfile.read(length)
        if self.path == PUSH_PATH:
            self.send_response(307)
            self.send_header("Location", type(self).inner + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._stream()

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()  # no Content-Length: only reading tells the size
        block = os.urandom(64 << 10)
        try:
            for _ in range(16 * 1024):  # 1 GiB at most, then give up
                self.wfile.write(block)
                type(self).streamed += len(block)
        except OSError:
            pass  # the node hung up: what we want


class _Inner(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *_args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST


def _serve(handler) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


# ----------------------------------------------------------------------------- observation


@dataclass
class Sampler:
    """Asks every honest node, every ``period_s``, for its health and its indexer's lag."""

    nodes: list
    period_s: float = 1.0
    max_lag: dict[str, int] = field(default_factory=dict)
    health_failures: list[str] = field(default_factory=list)
    slowest_health_s: float = 0.0
    samples: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while True:  # a sample at once, then every period_s until stopped
            for node in self.nodes:
                name = node.spec.name
                started = time.monotonic()
                try:
                    health = requests.get(f"{node.url}/api/health", timeout=HEALTH_TIMEOUT_S)
                    if health.status_code != 200:
                        self.health_failures.append(f"{name}: health {health.status_code}")
                except requests.RequestException as exc:
                    self.health_failures.append(f"{name}: health {type(exc).__name__}")
                self.slowest_health_s = max(self.slowest_health_s, time.monotonic() - started)
                try:
                    lag = node.api().get(f"{node.url}/api/node", timeout=60).json()["chain"]["lag"]
                except (requests.RequestException, ValueError, KeyError):
                    continue  # the health probe is the liveness check; this one only measures
                if lag is not None:
                    self.max_lag[name] = max(self.max_lag.get(name, 0), int(lag))
            self.samples += 1
            if self.stop.wait(self.period_s):
                return


def _indexed_block(node) -> int | None:
    return node.api().get(f"{node.url}/api/node", timeout=60).json()["chain"]["indexed_block"]


def _wait_indexed(nodes, block: int, what: str) -> None:
    """Every node's indexer passes ``block`` (an attack burst's last) within CATCH_UP_S."""
    deadline = time.monotonic() + CATCH_UP_S
    waiting = list(nodes)
    while waiting and time.monotonic() < deadline:
        waiting = [n for n in waiting if (_indexed_block(n) or -1) < block]
        if waiting:
            time.sleep(1)
    assert not waiting, f"after {what}: {[n.spec.name for n in waiting]} did not index block {block}"


def _vm_peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def endpoints():
    inner, inner_url = _serve(_Inner)
    _HostileEndpoint.inner = inner_url
    hostile, hostile_url = _serve(_HostileEndpoint)
    yield hostile_url
    hostile.shutdown()
    inner.shutdown()


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    # Every honest agent is limited: the draw decides who scores mallory's bomb.
    specs = [
        NodeSpec("org-a", memory_limit_bytes=VICTIM_LIMIT),
        NodeSpec("org-b", database="mariadb", memory_limit_bytes=VICTIM_LIMIT),
        NodeSpec("org-c", memory_limit_bytes=VICTIM_LIMIT),
    ]
    with LocalFederation(tmp_path_factory.mktemp("hostile-fed"), specs, log=lambda _line: None) as fed:
        yield fed


@pytest.fixture(scope="module")
def w3(federation):
    return Web3(HTTPProvider(federation.anvil.url, request_kwargs={"timeout": 60}))


@pytest.fixture(scope="module")
def deployment(federation):
    return load_deployment(federation.root / "contracts.json")


def _peers(federation) -> list[Peer]:
    return [Peer(node.url, node.address) for node in federation.nodes]


@pytest.fixture(scope="module")
def mallory(federation, w3, deployment, endpoints):
    """The hostile member: applies with its own key and endpoint; the honest members admit it."""
    member = HostileMember(w3, deployment)
    ensure_funds(w3, member.address)
    assert member.register_node("mallory", endpoints)["status"] == 1
    for voter in federation.nodes:
        voter.web.manage("node", "admit", member.address, check=False)
    registry = w3.eth.contract(
        address=deployment.address("NodeRegistry"),
        abi=[
            {
                "type": "function",
                "name": "isMember",
                "stateMutability": "view",
                "inputs": [{"name": "account", "type": "address"}],
                "outputs": [{"name": "", "type": "bool"}],
            }
        ],
    )
    assert registry.functions.isMember(member.address).call(), "the members did not admit mallory"
    return member


@pytest.fixture(scope="module")
def outsider(w3, deployment):
    party = HostileMember(w3, deployment)  # never registered: a key no registry lists
    ensure_funds(w3, party.address)
    return party


def _emit_refused_events(w3, deployment, outsider) -> list[str]:
    """Before the job: events today's contracts refuse, emitted at the contracts' addresses in
    real blocks (``emit_as`` swaps a contract's code for one transaction, so this runs while no
    honest transaction is in flight). Their transaction hashes."""

    def log(contract: str, event: str, **args) -> dict:
        return craft_log(deployment, contract, event, event_args(contract, event, **args), block=0)

    stranger = Account.create().address
    applied = log(
        "NodeRegistry",
        "NodeApplied",
        node=stranger,
        name=BAD_NAME,
        endpoint="http://emitted.test",
        pubkey=b"\x09" * 64,
        overlay=b"\x01" * 32,
    )
    ghost_join = log("FederatedLearning", "ParticipantJoined", jobId=2**255, node=stranger, datasetId=1)
    undecodable = log("NodeRegistry", "EndpointUpdated", node=stranger, endpoint="x")
    undecodable["data"] = b"\x00\x01"
    topicless = log("NodeRegistry", "NodeLeft", node=stranger, memberCount=1)
    topicless["topics"] = topicless["topics"][:1]
    rejected = []
    emit_as(w3, outsider.account, applied)  # mirrored, its name replaced and cut
    for crafted in (ghost_join, undecodable, topicless):
        rejected.append(emit_as(w3, outsider.account, crafted)["transactionHash"].hex())
    return rejected


def _decoded(decoder: EventDecoder, log):
    try:
        return decoder.decode(log)
    except Exception:  # the crafted logs of _emit_refused_events do not decode: not ours to read
        return None


def _hex(value: str) -> str:
    return value.lower().removeprefix("0x")


def _job_events(w3, deployment, job_id: int, name: str) -> list:
    """FederatedLearning's ``name`` events of job ``job_id``, decoded, in chain order."""
    decoder = EventDecoder()
    logs = w3.eth.get_logs({"fromBlock": 0, "address": deployment.address("FederatedLearning")})
    return [
        e
        for e in (_decoded(decoder, log) for log in logs)
        if e is not None and e.name == name and int(e.args["jobId"]) == job_id
    ]


def _by_round(events) -> dict:
    return {int(e.args["round"]): e for e in events}


def _lower(addresses) -> list[str]:
    return [a.lower() for a in addresses]


def _seats(member: HostileMember, job_id: int) -> list[str]:
    """The contract's committee(jobId): the seated members (the current round's while it trains)."""
    from backend.ledger.artifacts import load_artifact

    abi = load_artifact("FederatedLearning").abi
    contract = member.w3.eth.contract(address=member.deployment.address("FederatedLearning"), abi=abi)
    return _lower(contract.functions.committee(job_id).call())


# ----------------------------------------------------------------------------- the attacked job


class MalloryTrainer:
    """Mallory's trainer: once the job is started it reveals the draw secret it committed to at
    join (else it would take no part: NotDrawn). In each round it trains in, it spends a little
    privacy (so the contract takes its update) and submits a hostile reference as soon as the round
    opens, so no round waits for a deadline on its account. Its n-th update is ``references[n]``
    (the last one from then on), whichever round that is: a round whose committee seats mallory
    (the contract lets no member score and train at once) it sits out silently, and it never votes
    where a draw seats it to aggregate. Before its first update it tries one claiming 2^64-1
    samples (``inflated``: the refusal's name and the raw transaction's status)."""

    def __init__(self, member: HostileMember, job_id: int, references: list[bytes]) -> None:
        self.member, self.job_id, self.references = member, job_id, references
        self.submitted: dict[int, int] = {}
        self.sent_refs: dict[int, bytes] = {}
        self.seated: set[int] = set()  # rounds whose committee seats mallory: it stays silent
        self.inflated: tuple[str | None, int] | None = None
        self.revealed: int | None = None  # the draw secret's reveal: the raw transaction's status
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.3):
            try:
                state = self.member.job_state(self.job_id)
                if state["status"] == JobStatus.DRAWING and self.revealed is None:
                    self.revealed = int(self.member.reveal_draw(self.job_id)["status"])
                if state["status"] != JobStatus.RUNNING:
                    if state["status"] not in (JobStatus.OPEN, JobStatus.DRAWING):
                        return
                    continue
                round_ = int(state["round"])
                if state["phase"] != RoundPhase.TRAINING or round_ in self.submitted or round_ in self.seated:
                    continue
                if self.member.address.lower() in _seats(self.member, self.job_id):
                    self.seated.add(round_)  # a drawn seat: mallory neither scores nor proposes
                    continue
                reference = self.references[min(len(self.submitted), len(self.references) - 1)]
                if self.inflated is None:
                    self._inflated(round_, reference)
                if state["maxSpendPerRound"]:
                    self.member.spend(self.job_id, round_, 1)
                receipt = self.member.submit_update(self.job_id, round_, reference, SAMPLES)
                self.submitted[round_] = int(receipt["status"])
                self.sent_refs[round_] = reference
            except Exception as exc:  # keep attacking; the test reads the errors
                self.errors.append(repr(exc))

    def _inflated(self, round_: int, reference: bytes) -> None:
        args = HostileMember._update_args(self.job_id, round_, reference, 2**64 - 1, None, 0)
        refusal = self.member.refusal("FederatedLearning", "submitUpdate", **args)
        receipt = self.member.call("FederatedLearning", "submitUpdate", **args)
        self.inflated = (refusal, int(receipt["status"]))


@pytest.fixture(scope="module")
def attacked(federation, w3, deployment, mallory, outsider, endpoints):
    """The job, run to its end while mallory and the outsider attack; what was observed."""
    honest = federation.nodes
    peers = _peers(federation)
    report: dict = {"attacks": {}}
    rejected_txs = _emit_refused_events(w3, deployment, outsider)
    report["rejected_txs"] = rejected_txs

    datasets = [
        federation.upload_dataset(
            node, x, y, name=f"{node.spec.name}-digits", classes=range(10), epsilon_cap=30.0
        )
        for node, (x, y) in zip(honest, digits_parts(len(honest), seed=0), strict=True)
    ]
    payload = {
        "name": "attacked",
        "model": "mlp",
        "dataset": datasets[0]["id"],
        "rounds": ROUNDS,
        "local_epochs": 3,
        "batch_size": 32,
        "lr": 0.5,
        "strategy": "fedavg",
        "dp": {"mode": "sgd", "target_epsilon": 20.0, "delta": 1e-5, "max_grad_norm": 1.0},
        "committee_size": 1,
        "top_k": 2,
        "min_trainers": 2,
        # A round whose only seat is mallory's (the draw seats it one time in four) ends at its
        # commit deadline: the training period plus half the scoring period after it opened.
        # With 600 + 300 s that was 750 s of a CI run (1050 s of setup), with 240 + 90 s 285 s (a
        # 523 s setup), with 150 + 60 s 180 s a seat (a 371 s setup). 90 + 60 s costs a silent seat
        # 120 s and still leaves honest training (an MLP on 475 digits, seconds, mostly done ahead
        # of its round) and scoring (a 30 s commit window) many times their time on a loaded machine.
        "round_timeout_s": 90,
        "score_timeout_s": 60,
    }
    job = federation.create_job(honest[0], payload)
    job_id = int(job["id"])
    for node, dataset in zip(honest, datasets, strict=True):
        federation.join(node, job_id, dataset["id"])
    mallory_dataset = mallory.register_dataset(SAMPLES)
    assert mallory.join(job_id, mallory_dataset)["status"] == 1

    # Mallory's update references, on every honest node before they are needed.
    bomb_root, bomb = span_bomb()
    liar_root, liar = lying_span()
    garbage_root, garbage = blob_chunks(os.urandom(40_000))
    for chunks in (bomb, liar, garbage):
        mallory.store_everywhere(peers, chunks)
    trainer = MalloryTrainer(mallory, job_id, [bomb_root, garbage_root, liar_root])
    roots = _store_hostile_configs(mallory, peers, datasets[0]["schema_hash"])

    assert federation.wait_prepared(job_id, timeout_s=600), "a node did not prepare the first round"
    sampler = Sampler(list(honest))
    threads = [threading.Thread(target=t.run, daemon=True) for t in (sampler, trainer)]
    for thread in threads:
        thread.start()
    federation.start_job(honest[0], job_id)
    # The first committee is the contract's draw from all four participants (mallory included),
    # once each has revealed the secret it committed to at join: the attacks hit a running job.
    drawn = federation.wait_drawn(job_id)
    assert drawn["status"] == "running", drawn
    (started,) = _job_events(w3, deployment, job_id, "JobStarted")
    report["first_committee"] = _lower(started.args["committee"])
    try:
        report["attacks"] = _attack_during_the_job(federation, w3, mallory, outsider, job_id, roots)
        final = federation.wait_for_job(job_id, timeout_s=2400)
        report["max_lag_at_end"] = dict(sampler.max_lag)
    finally:
        sampler.stop.set()
        trainer.stop.set()
        for thread in threads:
            thread.join(60)
    report.update(job=final, sampler=sampler, trainer=trainer, datasets=datasets, bomb=bomb_root)
    summary = {
        "attacks": report["attacks"],
        "first_committee": report["first_committee"],
        "mallory_seated_rounds": sorted(trainer.seated),
        "mallory_revealed": trainer.revealed,
        "mallory_inflated": trainer.inflated,
        "mallory_updates": trainer.submitted,
        "mallory_errors": trainer.errors[-3:],
        "max_lag_blocks": sampler.max_lag,
        "health_probes": sampler.samples * len(honest),
        "health_failures": len(sampler.health_failures),
        "slowest_health_s": round(sampler.slowest_health_s, 2),
    }
    print("HOSTILE FEDERATION " + json.dumps(summary, default=str))
    return report


def _store_hostile_configs(mallory, peers, schema_hash) -> dict:
    """Mallory's config blobs for its hostile proposals, on every node beforehand: the roots."""
    bomb_root, bomb = span_bomb()
    liar_root, liar = lying_span(claimed=1000)
    hostile_config = JobConfig(
        name="hostile",
        model="mlp",
        input_shape=(1, 8, 8),
        num_classes=10,
        schema_hash=schema_hash,
        rounds=2,
        local_epochs=10**9,
        batch_size=32,
        model_options={"hidden": 10**9},
        dp=DPConfig(mode="sgd", target_epsilon=20.0),
        committee_size=1,
        top_k=1,
        min_trainers=1,
        round_timeout_s=600,
        score_timeout_s=300,
        join_timeout_s=3600,
    )
    config_root, config_chunks = blob_chunks(hostile_config.to_bytes())
    model_root, model_chunks = blob_chunks(b"not even a model")
    for chunks in (bomb, liar, config_chunks, model_chunks):
        mallory.store_everywhere(peers, chunks)
    return {
        "config_span_bomb": bomb_root,
        "config_lying_span": liar_root,
        "config_out_of_bounds": config_root,
        "model": model_root,
    }


def _attack_during_the_job(federation, w3, mallory, outsider, job_id, roots) -> dict:
    honest = federation.nodes
    peers = _peers(federation)
    seen: dict = {"timeline": []}
    started = time.monotonic()

    def mark(what: str) -> None:  # the job's state when each group of attacks was done
        job = federation.job(honest[0], job_id)
        seen["timeline"].append(
            [what, round(time.monotonic() - started, 1), job["status"], job["current_round"]]
        )

    # member: slow bodies on org-b's peer API for the first seconds (answered 408 when cut off)
    slow = _slowloris(mallory, honest[1], sockets=3)

    # outsider: registerNode with a name that is not UTF-8 and 10 KB long (the contract bounds it)
    seen["outsider_bad_name"] = outsider.register_node(BAD_NAME, "http://outsider.test")["status"]
    # member: spends, sample counts and a cancel the chain must refuse
    seen["spend_huge_job_id"] = mallory.spend(2**200, 1, 1)["status"]
    seen["spend_out_of_bounds"] = [mallory.spend(job_id, 1, amount)["status"] for amount in (0, 2**64 - 1)]
    # (an update claiming 2^64-1 samples: MalloryTrainer sends it in the first round it trains in)
    seen["cancel_foreign_job"] = mallory.call("FederatedLearning", "cancel", jobId=job_id)["status"]
    mark("bounded transactions")

    # member: hostile job proposals (configs that are bombs or out of bounds)
    now = w3.eth.get_block("latest")["timestamp"]
    proposals = {}
    for name in ("config_span_bomb", "config_lying_span", "config_out_of_bounds"):
        spec = JobSpec(
            config_hash=roots[name],
            initial_model_ref=roots["model"],
            initial_model_hash=b"\x01" * 32,
            rounds=2,
            committee_size=1,
            top_k=1,
            min_trainers=1,
            join_deadline=now + 3600,
            train_period=600,
            score_period=300,
            max_spend_per_round=1_000_000,
        )
        receipt, proposed = mallory.propose_job(spec)
        assert proposed is not None, (name, receipt)
        proposals[name] = proposed
    seen["proposals"] = proposals
    mark("hostile proposals")

    # member: a flood of cheap events (grants with garbage wrapped keys to the honest members)
    flood_dataset = mallory.register_dataset(10)
    grants = [
        {
            "datasetId": flood_dataset,
            "grantee": honest[i % len(honest)].address,
            "wrappedKey": os.urandom(512),
            "cap": 1_000_000,
        }
        for i in range(FLOOD)
    ]
    receipts = mallory.call_many("DataRegistry", "grant", grants)
    seen["event_flood"] = sum(int(r["status"]) for r in receipts)
    flood_end = max(int(r["blockNumber"]) for r in receipts)
    mark("event flood sent")

    # outsider and member: peer requests that must be refused before any body is read
    seen["unsigned_peer_request"] = [
        requests.post(p.url + HAS_PATH, data=bytes(32), timeout=30).status_code for p in peers
    ]
    seen["outsider_signed_peer_request"] = [
        outsider.peer_post(p, HAS_PATH, bytes(32)).status_code for p in peers
    ]
    seen["replayed_to_other_receiver"] = [
        mallory.peer_post(p, HAS_PATH, bytes(32), receiver=peers[(i + 1) % len(peers)].address).status_code
        for i, p in enumerate(peers)
    ]
    seen["oversized_peer_body"] = {
        "outsider": [_declared_body(outsider, p, 200 << 20) for p in peers],
        "member": [_declared_body(mallory, p, 200 << 20) for p in peers],
    }
    # member: chunks whose address is not their hash are not stored
    address, data = framed(10, b"0123456789")
    body = encode_batch([(bytes(32), data), (address[:-1] + bytes([address[-1] ^ 1]), data)])
    seen["chunks_failing_their_hash"] = [
        sorted(
            a.hex()
            for a in decode_addresses(
                mallory.peer_post(p, PUSH_PATH, body, digest=batch_digest(body)).content
            )
        )
        for p in peers
    ]
    mark("peer requests")

    # outsider: login brute force against org-c (the operator's API token keeps working)
    target = honest[2]
    codes = [
        requests.post(
            f"{target.url}/api/auth/login", json={"username": OPERATOR, "password": f"guess-{i}"}, timeout=30
        ).status_code
        for i in range(6)
    ]
    locked = requests.post(
        f"{target.url}/api/auth/login",
        json={"username": OPERATOR, "password": federation.password},
        timeout=30,
    )
    seen["login_brute_force"] = {"guesses": codes, "right_password": locked.status_code}
    mark("login brute force")

    _wait_indexed(honest, flood_end, "the event flood")
    mark("flood indexed")
    seen["slowloris"] = [thread_result() for thread_result in slow]
    return seen


def _declared_body(party: HostileMember, peer: Peer, length: int) -> int:
    """Send only the head of a request declaring ``length`` bytes; the status the node answers."""

    class Declared:
        def __len__(self) -> int:
            return length

    headers = party.signer.headers("POST", PUSH_PATH, Declared(), receiver=peer.address, digest="00" * 32)
    answer = _raw(peer, PUSH_PATH, headers, length, b"")
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _raw(peer: Peer, path: str, headers: dict, length: int, body: bytes) -> bytes:
    host, port = peer.url.removeprefix("http://").split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def _slowloris(party: HostileMember, node, sockets: int) -> list:
    """Open ``sockets`` connections that send valid headers and 10 bytes of a 256 KiB body, then
    nothing; one callable per socket that waits for the node to give up and returns its status."""
    peer = Peer(node.url, node.address)
    results: list[list] = [[] for _ in range(sockets)]
    threads = []
    for i in range(sockets):
        body = bytes(256 << 10)
        headers = party.signer.headers("POST", HAS_PATH, body, receiver=peer.address)

        def hold(slot=results[i], headers=headers, body=body) -> None:
            try:
                answer = _raw(peer, HAS_PATH, headers, len(body), body[:10])
                slot.append(int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0)
            except OSError as exc:
                slot.append(repr(exc))

        thread = threading.Thread(target=hold, daemon=True)
        thread.start()
        threads.append(thread)

    def result(i: int):
        threads[i].join(180)
        return results[i][0] if results[i] else "still held"

    return [lambda i=i: result(i) for i in range(sockets)]


# ----------------------------------------------------------------------------- assertions


def test_the_job_finishes_on_every_honest_node_with_the_fixed_models_on_chain(
    federation, w3, deployment, attacked, mallory
):
    """Liveness under attack: every finalized round's model is fixed on chain, or its aggregation
    skipped where the draw gave the aggregating seat to mallory (silent: a committee of one that
    never votes), and every honest node holds each fixed model with the hash the chain fixed."""
    job = attacked["job"]
    assert job["status"] == "finished", job
    job_id = int(job["id"])
    fixed = {
        number: _hex(
            event.args["modelHash"].hex()
            if isinstance(event.args["modelHash"], bytes)
            else event.args["modelHash"]
        )
        for number, event in _by_round(_job_events(w3, deployment, job_id, "GlobalModelFixed")).items()
    }
    skipped = set(_by_round(_job_events(w3, deployment, job_id, "AggregationSkipped")))
    finalized = _by_round(_job_events(w3, deployment, job_id, "RoundFinalized"))
    assert not set(fixed) & skipped and set(fixed) | skipped == set(finalized), (fixed, skipped)
    # Which rounds are skipped is the draws' doing, each a uniform seat of four: an honest
    # aggregating seat fixes its round, mallory's skips it (all three seats went to mallory in one
    # run, 1 in 64, and nothing was fixed: liveness held, the job finished on the initial model).
    me = mallory.address.lower()
    for number, event in finalized.items():
        aggregators = _lower(event.args["nextCommittee"])
        assert (number in skipped) == (aggregators == [me]), (number, aggregators, fixed, skipped)
    for node in federation.nodes:
        listed = node.api().get(f"{node.url}/api/models", params={"page_size": 100}, timeout=60).json()
        items = listed["results"] if isinstance(listed, dict) else listed
        models = {int(m["round"]): m for m in items if int(m["job"]) == job_id}
        assert set(models) == set(fixed), (node.spec.name, sorted(models))
        for number, model in models.items():
            blob = node.api().get(f"{node.url}/api/models/{model['id']}/download", timeout=120)
            assert blob.status_code == 200
            assert _hex(content_hash(blob.content)) == fixed[number], (node.spec.name, number)


def test_malloryss_hostile_updates_were_submitted_and_never_accepted(
    federation, w3, deployment, attacked, mallory
):
    """Attack class: poisoned update references (a 1 TiB tree, garbage, a lying tree): the
    committee scores them 0 (median 0 on chain) and the rounds go on without them; a claim of
    2^64-1 samples is refused by the contract for its samples (SamplesAboveDataset), in a round
    mallory trains in, whichever seats the draw gave it."""
    trainer = attacked["trainer"]
    assert trainer.revealed == 1, trainer.revealed  # it took part: its reveal was taken
    assert trainer.submitted and all(status == 1 for status in trainer.submitted.values()), (
        trainer.submitted,
        trainer.errors[-3:],
    )
    assert not set(trainer.submitted) & trainer.seated, (trainer.submitted, trainer.seated)
    assert trainer.sent_refs[min(trainer.submitted)] == attacked["bomb"]  # the bomb was sent
    assert trainer.inflated == ("SamplesAboveDataset", 0), trainer.inflated
    job_id = int(attacked["job"]["id"])
    rounds = federation.rounds(federation.nodes[0], job_id)
    theirs = [u for r in rounds for u in r["updates"] if u["trainer"].lower() == mallory.address.lower()]
    assert len(theirs) == len(trainer.submitted), theirs
    assert not any(u["accepted"] for u in theirs), theirs
    me = mallory.address.lower()
    for number, event in _by_round(_job_events(w3, deployment, job_id, "RoundFinalized")).items():
        trainers = _lower(event.args["trainers"])  # submission order, with their medians
        assert me not in _lower(event.args["accepted"]), (number, event.args)
        assert (me in trainers) == (number in trainer.submitted), (number, trainers)
        if me in trainers:
            assert event.args["medians"][trainers.index(me)] == 0, (number, event.args)


def test_every_committee_is_drawn_and_a_hostile_seat_cannot_stall_the_job(
    federation, w3, deployment, attacked, mallory
):
    """The first committee is the contract's draw (JobStarted) from the four participants, and
    each next one the draw of its round's seed (fl_node.committee.draw_committee), never a
    ranking. Attack class (when a draw seats mallory): a silent committee seat. A round it
    scores alone ends by its deadlines, accepts nothing (no scores) and keeps the previous model;
    a round it aggregates alone is skipped (see the first test). Every round an honest member sat
    in was scored by it, and mallory's rounds on the committee are exactly those the chain seated
    it in."""
    job_id = int(attacked["job"]["id"])
    me = mallory.address.lower()
    honest = {n.address.lower() for n in federation.nodes}
    first = attacked["first_committee"]
    assert len(first) == 1 and set(first) <= honest | {me}, first
    opened = _by_round(_job_events(w3, deployment, job_id, "RoundOpened"))
    finalized = _by_round(_job_events(w3, deployment, job_id, "RoundFinalized"))
    fixed = _by_round(_job_events(w3, deployment, job_id, "GlobalModelFixed"))
    scored = _job_events(w3, deployment, job_id, "ScoresSubmitted")
    drawn = [e.args["node"].lower() for e in _job_events(w3, deployment, job_id, "DrawSecretRevealed")]
    assert sorted(drawn) == sorted(honest | {me}), drawn
    assert 1 in opened and set(opened) <= set(range(1, ROUNDS + 1)), sorted(opened)
    assert _lower(opened[1].args["committee"]) == first
    for event in finalized.values():  # each next committee: the draw of the round's seed
        seed = bytes.fromhex(_hex(event.args["seed"]))
        assert _lower(event.args["nextCommittee"]) == draw_committee(seed, drawn, 1), event.args
    seated = {number for number, event in opened.items() if me in _lower(event.args["committee"])}
    assert seated == attacked["trainer"].seated, (seated, attacked["trainer"].seated)
    print(json.dumps({"first_committee": first, "mallory": me, "mallory_seated_rounds": sorted(seated)}))
    for number, event in opened.items():
        members = set(_lower(event.args["committee"]))
        scorers = {e.args["member"].lower() for e in scored if int(e.args["round"]) == number}
        assert scorers == members - {me}, (number, members, scorers)  # honest seats score; mallory never
        if number in seated:
            assert finalized[number].args["accepted"] == [], (number, finalized[number].args)
            if number in fixed:
                assert fixed[number].args["modelHash"] == event.args["modelHash"], number  # carried forward


def test_the_attacks_on_chain_ran_while_the_job_was_running(attacked):
    """The bounded transactions and the hostile proposals were sent into a running job (the
    timeline names the job's status and round after each group; the rest is reported)."""
    timeline = {what: (status, number) for what, _, status, number in attacked["attacks"]["timeline"]}
    for group in ("bounded transactions", "hostile proposals"):
        assert timeline[group][0] not in TERMINAL, attacked["attacks"]["timeline"]


def test_the_contracts_refuse_the_outsiders_and_the_members_out_of_bound_transactions(attacked):
    """Attack classes: malformed strings from an outsider; spends for absurd job ids and amounts;
    a member cancelling a job it does not own. The contracts refuse each (status 0): nothing
    reaches the indexers."""
    seen = attacked["attacks"]
    assert seen["outsider_bad_name"] == 0
    assert seen["spend_huge_job_id"] == 0
    assert seen["spend_out_of_bounds"] == [0, 0]
    assert seen["cancel_foreign_job"] == 0


def test_every_honest_indexer_kept_up_and_lists_the_rejected_events(federation, attacked):
    """Attack classes: events that cannot be decoded or stored, and a flood of cheap events. Every
    honest indexer passed the flood within CATCH_UP_S (checked during the attack), its lag never
    exceeded LAG_BOUND blocks, and ``GET /api/events`` shows each rejected event with a reason."""
    sampler = attacked["sampler"]
    assert attacked["attacks"]["event_flood"] == FLOOD
    assert sampler.samples >= 2  # it measured during the attack, not only after it
    assert set(sampler.max_lag) == {n.spec.name for n in federation.nodes}, sampler.max_lag
    assert max(sampler.max_lag.values()) < LAG_BOUND, sampler.max_lag
    for node in federation.nodes:
        events = node.api().get(
            f"{node.url}/api/events", params={"status": "rejected", "limit": 500}, timeout=60
        )
        assert events.status_code == 200
        listed = {_hex(e["tx_hash"]): e for e in events.json()}
        for tx in attacked["rejected_txs"]:
            assert _hex(tx) in listed, (node.spec.name, tx, list(listed)[:5])
            assert listed[_hex(tx)]["reason"], listed[_hex(tx)]


def test_every_honest_node_stayed_responsive_and_alive(federation, attacked):
    """Attack classes: slow bodies, oversized bodies, login brute force, a hostile endpoint. Every
    health probe during the job was answered; no node process exited."""
    sampler = attacked["sampler"]
    assert not sampler.health_failures, sampler.health_failures[:10]
    for node in federation.nodes:
        for what, process in (("web", node.web.process), ("agent", node.agent)):
            assert process is not None and process.poll() is None, f"{node.spec.name}'s {what} exited"


def test_peer_requests_from_outsiders_replays_and_oversized_bodies_are_refused(attacked):
    """Attack classes: unauthenticated and non-member peer requests, a request replayed to another
    receiver, a declared 200 MiB body, slow bodies, forged chunk addresses."""
    seen = attacked["attacks"]
    assert all(code == 401 for code in seen["unsigned_peer_request"]), seen["unsigned_peer_request"]
    assert all(code in (401, 403) for code in seen["outsider_signed_peer_request"]), seen
    assert all(code == 401 for code in seen["replayed_to_other_receiver"]), seen["replayed_to_other_receiver"]
    oversized = seen["oversized_peer_body"]
    # refused from the headers: the outsider as a non-member (403) or for the size (413)
    assert all(code in (403, 413) for code in oversized["outsider"]), oversized
    assert oversized["member"] == [413] * 3, oversized
    assert all(code == 408 for code in seen["slowloris"]), seen["slowloris"]
    assert seen["chunks_failing_their_hash"] == [[], [], []], seen["chunks_failing_their_hash"]


def test_login_brute_force_is_locked_out(attacked):
    """Attack class: online password guessing against an honest node during the job."""
    seen = attacked["attacks"]["login_brute_force"]
    assert all(code in (401, 429) for code in seen["guesses"]), seen
    assert seen["right_password"] == 429, seen


def test_hostile_job_proposals_are_declined_with_a_reason(federation, attacked):
    """Attack classes: resource exhaustion through a job's config (a 1 TiB tree, a lying tree,
    10^9 hidden units and epochs). Every honest agent declines each job and says why; the API
    refuses a join with the reason (409, or 413 for the oversized root); no honest node joins."""
    proposals = attacked["attacks"]["proposals"]
    for node, dataset in zip(federation.nodes, attacked["datasets"], strict=True):
        log = (node.web.data_dir / "agent.log").read_text(errors="replace")
        for name, job_id in proposals.items():
            assert re.search(rf"declin\w* job {job_id}: \S", log), (node.spec.name, name)
            response = node.api().post(
                f"{node.url}/api/jobs/{job_id}/join", json={"dataset": dataset["id"]}, timeout=60
            )
            # 409: the node declines it; 413: its API refuses the config's root for its size,
            # from that chunk alone; 404: not indexed yet. The reason is the one the agent logged.
            assert response.status_code in (404, 409, 413), (node.spec.name, name, response.text)
            if response.status_code != 404:
                detail = response.json()["detail"]
                reason = detail.split(": ", 1)[1] if detail.startswith("this node declines") else detail
                assert reason and reason in log, (node.spec.name, name, detail)


def test_the_victim_stayed_within_its_memory_limit(federation, w3, deployment, attacked):
    """Attack class: memory exhaustion by chunk-tree bombs (config and update references). The
    victim (the honest committee of the round mallory sent its 1 TiB update in, which scored it)
    ran under an address-space limit and is still alive, its peak resident memory well under that
    limit; so did every other honest agent (each fetched the hostile configs)."""
    trainer = attacked["trainer"]
    bomb_round = min(trainer.submitted)
    assert trainer.sent_refs[bomb_round] == attacked["bomb"]
    opened = _by_round(_job_events(w3, deployment, int(attacked["job"]["id"]), "RoundOpened"))
    victims = set(_lower(opened[bomb_round].args["committee"]))
    by_address = {node.address.lower(): node for node in federation.nodes}
    assert victims and victims <= set(by_address), (bomb_round, victims)  # an honest seat scored it
    peaks = {}
    for node in federation.nodes:
        assert node.spec.memory_limit_bytes == VICTIM_LIMIT
        assert node.agent is not None and node.agent.poll() is None, node.spec.name
        peaks[node.spec.name] = _vm_peak_rss(node.agent.pid)
        assert peaks[node.spec.name] < VICTIM_LIMIT // 2, (node.spec.name, peaks)
        assert "MemoryError" not in (node.web.data_dir / "agent.log").read_text(errors="replace")
    names = sorted(by_address[v].spec.name for v in victims)
    attacked["victim_peak_rss"] = {name: peaks[name] for name in names}
    print(
        json.dumps(
            {
                "bomb_round": bomb_round,
                "victims": names,
                "peak_rss_mib": {name: peak >> 20 for name, peak in peaks.items()},
                "limit_mib": VICTIM_LIMIT >> 20,
            }
        )
    )


def test_malloryss_endpoint_was_never_followed_inward(attacked):
    """Attack class: request forgery through a member's endpoint (redirects to an inner address)
    and memory exhaustion through a response without end: the honest nodes never reached the
    inner address, and cut every endless response off."""
    assert _Inner.hits == [], _Inner.hits
    print(
        json.dumps(
            {
                "hostile_endpoint_requests": len(_HostileEndpoint.hits),
                "streamed_mib": _HostileEndpoint.streamed >> 20,
                "max_lag_blocks": attacked["sampler"].max_lag,
                "slowest_health_s": round(attacked["sampler"].slowest_health_s, 2),
            }
        )
    )
