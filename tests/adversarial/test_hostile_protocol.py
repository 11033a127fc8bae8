"""A hostile pair attacks the round protocol of a running DP job of real node processes (issue 14).

Three honest organizations run a 3-round DP job on anvil, on a production deployment (no
development flag: committees odd and at least 3), with a committee of 3 and two trainers a round;
two hostile keys (``HostileMember``: raw transactions, signed peer requests, a key server as
their endpoint), admitted by the honest members, join it. One federation run serves every case
(module-scoped fixture); the attack scripts are in ``protocol_attacks.py``, which says what each
key does in each round. Every committee is drawn by the contract, so the roles after round 1 are
read from the chain, never assumed.

The case's defences, asserted below:
- copying an honest update: the same reference and content hash is refused (DuplicateContent);
  the same reference with another hash is taken, scored 0 by every honest member, rejected;
- inflated samples (more than the registered dataset): refused (SamplesAboveDataset);
- a silent committee seat (a hostile key the draw seats that never commits or reveals, or never
  votes): the round ends at its commit deadline with the honest reveals, and an honest majority
  fixes the model (a committee the draw gave both hostile keys skips its aggregation);
- a hijacked vote (the right hash with a 1 TiB span-bomb reference, the round's first vote): no
  honest member votes for it; the model fixed is the honest pair (its reference digest is that of
  the aggregate's honest bytes);
- a colluding pair (one scores its partner's copy 10000): 1 colluder of 3 cannot lift the
  median, the copy is rejected; what 2 of 3 could do is shown on the reference rule;
- score tailoring: reading scores before committing (none to read), revealing before committing
  (NotCommitted), before every member committed (RevealNotOpen), other scores than committed
  (CommitmentMismatch): refused;
- the last revealer: it knows the next committee before its reveal (the job's random state is
  public once every other salt is in), and the chain draws exactly that: it can withhold, not choose.
At the end every honest node holds every round's fixed model under the on-chain hash, and each
fixed model is the honest members' aggregation (the job's robust defense) of the accepted
updates, recomputed here from the blobs.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from eth_account import Account
from eth_utils import keccak
from web3 import HTTPProvider, Web3

from backend.ledger.chains import ensure_funds
from backend.ledger.client import ChainClient
from backend.ledger.contracts import FederatedLearning, NodeRegistry
from backend.ledger.deployment import load_deployment
from devnet.localnet import NodeSpec
from fl_node.codec import content_hash
from fl_node.committee import decide_round, draw_committee
from tests.adversarial.hostile_member import HostileMember, KeyServer, Peer, span_bomb
from tests.adversarial.protocol_attacks import (
    JUNK_SCORE,
    SAMPLES,
    ChainLog,
    HostilePair,
    Models,
    Report,
    Roles,
    hex_of,
    lower,
    raw,
    steady,
)
from tests.faults.faultnet import ProxiedFederation
from tests.jobs.jobs_helpers import digits_parts

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
]

ROUNDS = 3  # round 1 by the steady draw; rounds 2 and 3 give the draw room to seat a hostile key
TRAIN_S = 40  # round_timeout_s: the update deadline after a round opens
# score_timeout_s: commits in its first half, reveals in the second; also the aggregation's time
# after a round is finalized, which round 1's pause (the hijack's aggregate, computed here) spends
# a few seconds of.
SCORE_S = 40
TIMINGS: dict[str, object] = {}  # seconds of each phase, printed with the run's report
MAX_DRAWS = 20  # jobs started until the drawn committee holds exactly one hostile key (p = 0.6 a
# draw: all 20 miss with p = 0.4**20 < 1e-7); a later draw costs ~5-30 s (the nodes are prepared)
RUN_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    specs = [NodeSpec("org-a"), NodeSpec("org-b"), NodeSpec("org-c")]
    root = tmp_path_factory.mktemp("hostile-protocol")
    started = time.monotonic()
    # The nodes reach the chain through a proxy the hijack's round turns dark for a few seconds.
    with ProxiedFederation(
        root, specs, agent_interval=1.0, allow_small_committees=False, log=lambda _line: None
    ) as fed:
        TIMINGS["federation_start_s"] = round(time.monotonic() - started, 1)
        yield fed


@pytest.fixture(scope="module")
def keys():
    """The hostile pair's registered endpoint: it serves the keys of their sealed updates."""
    server = KeyServer()
    yield server
    server.close()


def _draw(federation, w3, deployment, pair, payload, datasets, hostile_datasets) -> tuple[int, list[str]]:
    """One job created, joined by all five and started; its first committee, once every
    participant revealed the secret it committed to at join."""
    honest = federation.nodes
    job_id = int(federation.create_job(honest[0], payload)["id"])
    federation.join(honest[0], job_id, datasets[0]["id"])
    assert pair[1].join(job_id, hostile_datasets[1])["status"] == 1
    federation.join(honest[1], job_id, datasets[1]["id"])
    assert pair[0].join(job_id, hostile_datasets[0])["status"] == 1
    federation.join(honest[2], job_id, datasets[2]["id"])
    assert federation.wait_prepared(job_id, timeout_s=300), "a node did not prepare round 1"
    federation.start_job(honest[0], job_id)
    for member in pair:
        assert member.reveal_draw(job_id)["status"] == 1
    log = ChainLog(w3, deployment, job_id)
    started = _wait(lambda: log.events("JobStarted"), 120, "the first committee's draw")
    return job_id, lower(started[0].args["committee"])


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"waited {timeout_s:.0f}s for {what}")


@pytest.fixture(scope="module")
def run(federation, keys):
    """The job, run to its end while the hostile pair attacks it; what was observed."""
    started = time.monotonic()
    honest = federation.nodes
    w3 = Web3(HTTPProvider(federation.anvil.url, request_kwargs={"timeout": 60}))
    deployment = load_deployment(federation.root / "contracts.json")
    peers = [Peer(node.url, node.address) for node in honest]
    pair = [HostileMember(w3, deployment), HostileMember(w3, deployment)]
    for name, member in zip(("mallory", "trudy"), pair, strict=True):
        ensure_funds(w3, member.address)
        assert member.register_node(name, keys.url)["status"] == 1

    def vote_in(voter) -> None:  # one voter's votes in order (one key), the voters at once
        for member in pair:
            voter.web.manage("node", "admit", member.address, check=False)

    def upload(node, part) -> dict:
        x, y = part
        return federation.upload_dataset(
            node, x, y, name=f"{node.spec.name}-digits", classes=range(10), epsilon_cap=90.0
        )

    registry = NodeRegistry(deployment.address("NodeRegistry"), ChainClient(w3, pair[0].account))
    with ThreadPoolExecutor(len(honest)) as pool:
        # A vote is a management command beside the node's own agent (check=False: a vote after
        # the threshold is refused); one lost on a loaded machine is sent again, and the members
        # must be admitted before they register anything (DataRegistry refuses NotMember).
        for _ in range(4):
            list(pool.map(vote_in, honest))
            if all(registry.is_member(member.address) for member in pair):
                break
        assert all(registry.is_member(member.address) for member in pair), "the hostile pair was not admitted"
        datasets = list(pool.map(upload, honest, digits_parts(len(honest), seed=1)))
    schema = datasets[0]["schema_hash"]  # the honest data's: a job of it counts these members in
    hostile_datasets = [member.register_dataset(SAMPLES, 90_000_000, schema_hash=schema) for member in pair]
    bomb_root, bomb = span_bomb()
    pair[0].store_everywhere(peers, bomb)  # the hijacker's reference: a 1 TiB tree on every node
    payload = {
        "name": "hostile-protocol",
        "model": "mlp",
        "dataset": datasets[0]["id"],
        "rounds": ROUNDS,
        "local_epochs": 2,
        "batch_size": 32,
        "lr": 0.5,
        "strategy": "fedavg",
        "dp": {"mode": "sgd", "target_epsilon": 8.0, "delta": 1e-5, "max_grad_norm": 1.0},
        "committee_size": 3,
        "top_k": 2,
        "min_trainers": 1,
        "round_timeout_s": TRAIN_S,
        "score_timeout_s": SCORE_S,
    }
    hostile = [m.address for m in pair]
    draws = []
    TIMINGS["setup_s"] = round(time.monotonic() - started, 1)
    TIMINGS["draws_s"] = []
    for _ in range(MAX_DRAWS):
        drawing = time.monotonic()
        job_id, committee = _draw(federation, w3, deployment, pair, payload, datasets, hostile_datasets)
        draws.append(committee)
        TIMINGS["draws_s"].append(round(time.monotonic() - drawing, 1))
        if steady(committee, hostile):
            break
        response = honest[0].api().post(f"{honest[0].url}/api/jobs/{job_id}/cancel", json={}, timeout=60)
        assert response.status_code < 300, response.text
    else:
        pytest.fail(f"no usable committee in {MAX_DRAWS} draws: {draws}")
    scorer = next(m for m in pair if m.address.lower() in committee)
    roles = Roles(committee, trainer=next(m for m in pair if m is not scorer), scorer=scorer)
    report = Report()
    attackers = HostilePair(
        w3,
        deployment,
        peers,
        [n.address for n in honest],
        federation.proxy,
        job_id,
        roles,
        keys,
        report,
        rounds=ROUNDS,
        timeout_s=RUN_TIMEOUT_S,
    )
    threads = attackers.start()
    running = time.monotonic()
    final = federation.wait_for_job(job_id, timeout_s=RUN_TIMEOUT_S)
    TIMINGS["job_s"] = round(time.monotonic() - running, 1)
    for thread in threads:
        thread.join(60)
    seconds = round(time.monotonic() - started, 1)
    print(
        "HOSTILE PROTOCOL "
        + json.dumps(
            {
                "draws": len(draws),
                "seconds": seconds,
                "timings": TIMINGS,
                "attempts": report.attempts,
                "seats": report.seats,
            },
            default=str,
        )
    )
    log = ChainLog(w3, deployment, job_id)
    return {
        "job": final,
        "job_id": job_id,
        "roles": roles,
        "report": report,
        "log": log,
        "models": Models(roles.trainer, peers, log, keys),
        "honest": [n.address.lower() for n in honest],
        "hostile": [h.lower() for h in hostile],
        "bomb_root": hex_of(bomb_root),
        "w3": w3,
        "deployment": deployment,
    }


def _scores_by_member(log: ChainLog, round_: int) -> dict[str, dict[str, int]]:
    return {
        e.args["member"].lower(): {
            t.lower(): int(s) for t, s in zip(e.args["trainers"], e.args["scores"], strict=True)
        }
        for e in log.events("ScoresSubmitted", round_)
    }


def test_the_attack_scripts_ran_to_their_end(run):
    report = run["report"]
    assert not report.errors, report.errors
    assert run["job"]["status"] == "finished", run["job"]


def test_inflated_samples_are_refused(run):
    seen = run["report"].attempts["inflated_samples"]
    assert seen["status"] == 0 and seen["error"] == "SamplesAboveDataset", seen


def test_a_copied_update_is_refused_or_scored_zero(run):
    """The honest update's reference and hash: refused. Its reference with another hash: taken,
    and the copier hands out the honest trainer's key for it (asked of the peers as any
    participant may): the blob opens, to bytes of another hash, so every honest member scores it
    0 (the trainer's fault, final: envelope.WrongContent); never accepted."""
    attempts, log = run["report"].attempts, run["log"]
    assert attempts["exact_copy"]["status"] == 0 and attempts["exact_copy"]["error"] == "DuplicateContent", (
        attempts
    )
    assert attempts["copy_other_hash"]["status"] == 1 and attempts["copy_key_served"], attempts
    copier = run["roles"].trainer.address.lower()
    scores = _scores_by_member(log, 1)
    honest = {h.lower() for h in run["honest"]}
    honest_scorers = [m for m in scores if m in honest]
    assert len(honest_scorers) == 2, scores
    assert all(scores[m][copier] == 0 for m in honest_scorers), scores
    accepted = [a.lower() for a in log.events("RoundFinalized", 1)[0].args["accepted"]]
    assert copier not in accepted, accepted
    assert attempts["copied_from"].lower() in accepted, (attempts["copied_from"], accepted)


def test_one_colluder_of_three_cannot_carry_a_junk_update(run):
    """The colluder revealed 10000 for its partner's copy: the median of (10000, 0, 0) is 0 and the
    copy is rejected, on chain as by the reference rule. With two colluders of three the median
    is theirs: the same scores with one honest member replaced accept the copy. That is what an
    odd committee of 3 leaves open (a drawn committee makes a captured majority unlikely, not
    impossible), stated here on fl_node.committee."""
    roles, log = run["roles"], run["log"]
    assert run["report"].attempts["reveal"]["status"] == 1, run["report"].attempts
    scores = _scores_by_member(log, 1)
    colluder, partner = roles.scorer.address.lower(), roles.trainer.address.lower()
    assert scores[colluder] == {partner: JUNK_SCORE}, scores
    finalized = log.events("RoundFinalized", 1)[0].args
    trainers = lower(finalized["trainers"])  # submission order, with their medians
    medians = dict(zip(trainers, (int(m) for m in finalized["medians"]), strict=True))
    assert medians[partner] == 0, medians
    assert partner not in lower(finalized["accepted"])

    base = {e.args["member"].lower(): int(e.args["baseScore"]) for e in log.events("ScoresSubmitted", 1)}
    rule = dict(top_k=2, base_scores=base, margin=int(finalized["margin"]), seed=raw(finalized["seed"]))
    outcome = decide_round(trainers, scores, **rule)
    assert outcome.medians == medians and outcome.accepted == lower(finalized["accepted"])
    honest_member = next(m for m in scores if m != colluder)
    captured = dict(scores, **{honest_member: dict(scores[honest_member], **{partner: JUNK_SCORE})})
    assert partner in decide_round(trainers, captured, **rule).accepted  # 2 of 3 carry it


def test_score_tailoring_is_refused(run):
    """Before committing the colluder can read no score (the others' are commitments); revealing
    before committing, before every member committed, or other scores than committed reverts."""
    attempts = run["report"].attempts
    before = attempts["before_commit"]
    assert before["scores_events"] == 0 and all(p == 0 for p in before["packed_scores"]), before
    assert attempts["reveal_before_commit"]["error"] == "NotCommitted", attempts["reveal_before_commit"]
    assert attempts["reveal_before_commit"]["status"] == 0
    early = attempts["reveal_before_all_committed"]
    assert early["status"] == 0, early
    if early["commits_then"] < 3:  # the honest members had not all committed yet
        assert early["error"] == "RevealNotOpen", early
    mismatch = attempts["reveal_other_scores"]
    assert mismatch["status"] == 0 and mismatch["error"] == "CommitmentMismatch", mismatch


def test_the_last_revealer_knows_the_next_committee_and_cannot_choose_it(run):
    """The colluder revealed round 1's scores last: before its reveal it computed the committee its
    reveal would draw (fl_node.committee over the job's public random state and its own salt), and
    the chain drew exactly that, uniformly from the participants (no ranking elects it). Its one
    choice was to reveal or to withhold, and a withheld reveal bans (none was withheld here)."""
    attempts, log = run["report"].attempts, run["log"]
    (finalized,) = log.events("RoundFinalized", 1)
    drawn = lower(finalized.args["nextCommittee"])
    assert attempts["predicted_next_committee"] == drawn == attempts["round1_next_committee"]
    assert not log.events("ScoresWithheld")
    for round_ in sorted({int(e.args["round"]) for e in log.events("RoundFinalized")}):
        (event,) = log.events("RoundFinalized", round_)
        expected = draw_committee(raw(event.args["seed"]), log.drawn(), 3, banned=log.banned(round_))
        assert lower(event.args["nextCommittee"]) == expected, round_


def test_a_silent_committee_seat_does_not_stall_the_job(run):
    """Every seat the draw gave a hostile key after round 1's scoring stayed silent: a scoring seat
    never committed or revealed, and its round finalized on the honest reveals (both mined after
    the commit deadline, at about the same time: the one mined second finalizes, and its gas must
    cover that: backend/ledger/contracts.finalize_headroom); an aggregating seat never voted, and
    the honest members fixed the model, or, where the draw seated both hostile keys (no honest
    majority), the round's aggregation was skipped at its deadline. The draws gave at least one
    such seat (all three rounds without one: p = 0.001)."""
    log, report = run["log"], run["report"]
    hostile, honest = set(run["hostile"]), set(run["honest"])
    assert report.seats, "the draws seated no hostile key after round 1's scoring"
    for seat in report.seats:
        round_, member = seat["round"], seat["member"]
        if seat["kind"] == "score":
            committee = lower(log.events("RoundOpened", round_)[0].args["committee"])
            assert member in committee, seat
            assert member not in log.members("ScoresCommitted", round_), seat
            assert log.members("ScoresSubmitted", round_) == set(committee) - hostile, seat
            assert log.events("RoundFinalized", round_), f"round {round_} never finalized"
        else:
            aggregators = set(lower(log.events("RoundFinalized", round_)[0].args["nextCommittee"]))
            assert member in aggregators, seat
            assert member not in log.members("GlobalModelVoted", round_), seat
            if len(aggregators & honest) >= 2:
                assert log.events("GlobalModelFixed", round_), f"round {round_}'s model was not fixed"
            else:
                assert log.events("AggregationSkipped", round_), (
                    f"round {round_} was neither fixed nor skipped"
                )
    for round_ in {int(e.args["round"]) for e in log.events("UpdateSubmitted")}:
        for key in set(report.attempts) & {f"round{round_}_garbage_{h}" for h in hostile}:
            assert report.attempts[key]["status"] == 1, (key, report.attempts[key])


def test_a_hijacked_vote_is_never_fixed(run):
    """A hostile key the draw seated on round 1's aggregating committee voted first (the honest
    nodes were cut off from the chain across the finalizing reveal) for the right model hash with the span bomb's
    reference. No honest member voted for that pair; it holds its one vote; the model fixed has the
    reference of the aggregate's honest bytes. When the draw seated no hostile key there (p = 0.1),
    the honest members fixed round 1 unopposed."""
    hijack, log = run["report"].attempts["hijack"], run["log"]
    honest = set(run["honest"])
    aggregators = set(lower(log.events("RoundFinalized", 1)[0].args["nextCommittee"]))
    bogus = hex_of(keccak(raw(run["bomb_root"])))
    for vote in log.events("GlobalModelVoted", 1):
        if vote.args["member"].lower() in honest:
            assert hex_of(keccak(raw(vote.args["modelRef"]))) != bogus, vote
    if not hijack["sent"]:
        assert not aggregators & set(run["hostile"]), (hijack, aggregators)
        assert log.events("GlobalModelFixed", 1), "round 1 was not fixed"
        print(json.dumps({"hijack": "not exercised: no hostile key on round 1's aggregating committee"}))
        return
    assert hijack["status"] == 1, hijack
    votes = log.events("GlobalModelVoted", 1)
    first = min(votes, key=lambda e: (e.block_number, e.log_index))
    assert first.args["member"].lower() == hijack["by"], first.args  # the pair exists on chain
    hijacks = [v for v in votes if v.args["member"].lower() == hijack["by"]]
    assert [hex_of(v.args["modelRef"]) for v in hijacks] == [hex_of(run["bomb_root"])], votes
    assert [int(v.args["votes"]) for v in hijacks] == [1]
    contract = FederatedLearning(run["deployment"].address("FederatedLearning"), _reader(run))
    vote = contract.get_vote(run["job_id"], 1, raw(hijack["model_hash"]), raw(run["bomb_root"]))
    assert vote.votes == 1, vote  # nobody joined it
    fixed = log.events("GlobalModelFixed", 1)
    if len(aggregators & honest) >= 2:
        (event,) = fixed
        assert hex_of(event.args["modelHash"]) == hijack["model_hash"]  # the hash was right
        assert hex_of(event.args["referenceDigest"]) == hex_of(keccak(raw(hijack["honest_reference"])))
    else:  # the draw seated both hostile keys: one honest vote is no majority
        assert not fixed and log.events("AggregationSkipped", 1), (fixed, aggregators)


def _reader(run) -> ChainClient:
    """A client that only reads (a fresh key: nothing is sent with it)."""
    return ChainClient(run["w3"], Account.create())


def test_every_fixed_model_is_the_honest_aggregation_and_every_node_holds_it(federation, run):
    log, models = run["log"], run["models"]
    honest = set(run["honest"])
    fixed = {int(e.args["round"]): hex_of(e.args["modelHash"]) for e in log.events("GlobalModelFixed")}
    skipped = {int(e.args["round"]) for e in log.events("AggregationSkipped")}
    finalized = {int(e.args["round"]) for e in log.events("RoundFinalized")}
    assert finalized and set(fixed) | skipped == finalized and not set(fixed) & skipped, (fixed, skipped)
    # A round is fixed exactly when its aggregating committee holds an honest majority (2 of 3); the
    # draw seats both hostile keys there 3 times in 10, and a skip voids the round after it, so no
    # fixed model at all (rounds 1 and 3 both drawn so) is a legitimate 9% outcome.
    for number in finalized:
        aggregators = set(lower(log.events("RoundFinalized", number)[0].args["nextCommittee"]))
        assert (number in fixed) == (len(aggregators & honest) >= 2), (number, aggregators, fixed)
    if not fixed:
        print(
            json.dumps({"fixed_models": "none: every finalized round's aggregators were both hostile keys"})
        )
    for number, model_hash in fixed.items():
        accepted = lower(log.events("RoundFinalized", number)[0].args["accepted"])
        assert set(accepted) <= honest, (number, accepted)
        expected = models.expected(number)
        assert "0x" + content_hash(expected) == model_hash, number
        assert models.blob(models.fixed(number)[0]) == expected, number
    job_id = run["job_id"]
    for node in federation.nodes:
        listed = node.api().get(f"{node.url}/api/models", params={"page_size": 100}, timeout=60).json()
        items = listed["results"] if isinstance(listed, dict) else listed
        held = {int(m["round"]): m for m in items if int(m["job"]) == job_id}
        assert set(held) == set(fixed), (node.spec.name, sorted(held))
        for number, model in held.items():
            blob = node.api().get(f"{node.url}/api/models/{model['id']}/download", timeout=120)
            assert blob.status_code == 200
            assert "0x" + content_hash(blob.content) == fixed[number], (node.spec.name, number)
