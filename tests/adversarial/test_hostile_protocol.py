"""A hostile pair attacks the round protocol of a running DP job of real node processes (issue 14).

Three honest organizations run a 2-round DP job on anvil with a committee of 3 and two trainers
a round; two hostile keys (``HostileMember``: raw transactions, signed peer requests), admitted
by the honest members, join it. One federation run serves every case (module-scoped fixture);
the attack scripts are in ``protocol_attacks.py``, which says what each key does in each round.

The case's defences, asserted below:
- copying an honest update: the same reference and content hash is refused (DuplicateContent);
  the same reference with another hash is taken, scored 0 by every honest member, rejected;
- inflated samples (more than the registered dataset): refused (SamplesAboveDataset);
- a silent committee seat (never commits or reveals; never proposes or confirms): the round
  ends at its commit deadline with the honest reveals, and the honest majority fixes the model;
- a hijacked proposal (the right hash with a 1 TiB span-bomb reference, sent the moment the
  round aggregates, racing the honest proposer): no honest
  member votes for it; the model fixed is the honest pair (its reference digest is that of the
  aggregate's honest bytes);
- a colluding pair (one scores its partner's copy 10000): 1 colluder of 3 cannot lift the
  median, the copy is rejected; what 2 of 3 could do is shown on the reference rule;
- score tailoring: reading scores before committing (none to read), revealing before committing
  (NotCommitted), before every member committed (RevealNotOpen), other scores than committed
  (CommitmentMismatch): refused.
At the end every honest node holds every round's fixed model under the on-chain hash, and each
fixed model is the honest-only aggregation of the accepted updates, recomputed here.
"""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from eth_utils import keccak
from web3 import HTTPProvider, Web3

from backend.ledger.chains import ensure_funds
from backend.ledger.client import ChainClient
from backend.ledger.contracts import NodeRegistry
from backend.ledger.deployment import load_deployment
from devnet.localnet import LocalFederation, NodeSpec
from fl_node.codec import content_hash
from fl_node.committee import decide_round
from tests.adversarial.hostile_member import HostileMember, Peer, span_bomb
from tests.adversarial.protocol_attacks import (
    JUNK_SCORE,
    SAMPLES,
    ChainLog,
    HostilePair,
    Models,
    Report,
    Roles,
    hex_of,
    proposals_bind_reference,
    raw,
    steady,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.xdist_group("e2e-hostile-protocol"),
]

ROUNDS = 2
TRAIN_S = 40  # round_timeout_s: the update deadline after a round opens
SCORE_S = 20  # score_timeout_s: commits in its first half, reveals in the second
TIMINGS: dict[str, object] = {}  # seconds of each phase, printed with the run's report
MAX_DRAWS = 20  # jobs started until the drawn committee holds one hostile key off seat 0 (p = 0.4 a
# draw: all 20 miss with p = 0.6**20 < 1e-4); a later draw costs ~1-3 s (the nodes are prepared)
RUN_TIMEOUT_S = 900


def _dead_endpoint() -> str:
    """A loopback port nothing listens on: the hostile keys serve nothing (no chunks, no keys)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _digits_parts(parts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(1).permutation(len(y))
    return [(x[idx], y[idx]) for idx in np.array_split(order, parts)]


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    specs = [NodeSpec("org-a"), NodeSpec("org-b"), NodeSpec("org-c")]
    root = tmp_path_factory.mktemp("hostile-protocol")
    started = time.monotonic()
    with LocalFederation(root, specs, agent_interval=1.0, log=lambda _line: None) as fed:
        TIMINGS["federation_start_s"] = round(time.monotonic() - started, 1)
        yield fed


@pytest.fixture(scope="module")
def run(federation):
    """The job, run to its end while the hostile pair attacks it; what was observed."""
    started = time.monotonic()
    honest = federation.nodes
    w3 = Web3(HTTPProvider(federation.anvil.url, request_kwargs={"timeout": 60}))
    deployment = load_deployment(federation.root / "contracts.json")
    peers = [Peer(node.url, node.address) for node in honest]
    pair = [HostileMember(w3, deployment), HostileMember(w3, deployment)]
    for name, member in zip(("mallory", "trudy"), pair, strict=True):
        ensure_funds(w3, member.address)
        assert member.register_node(name, _dead_endpoint())["status"] == 1

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
        datasets = list(pool.map(upload, honest, _digits_parts(len(honest))))
    hostile_datasets = [member.register_dataset(SAMPLES) for member in pair]
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
        job_id = int(federation.create_job(honest[0], payload)["id"])
        # Join order: a contract whose proposer names the committee takes the first three joined.
        federation.join(honest[0], job_id, datasets[0]["id"])
        assert pair[1].join(job_id, hostile_datasets[1])["status"] == 1
        federation.join(honest[1], job_id, datasets[1]["id"])
        assert pair[0].join(job_id, hostile_datasets[0])["status"] == 1
        federation.join(honest[2], job_id, datasets[2]["id"])
        assert federation.wait_prepared(job_id, timeout_s=300), "a node did not prepare round 1"
        federation.start_job(honest[0], job_id)
        committee = ChainLog(w3, deployment, job_id).events("JobStarted")[0].args["committee"]
        draws.append(committee)
        TIMINGS["draws_s"].append(round(time.monotonic() - drawing, 1))
        if steady(committee, hostile):
            break
        response = honest[0].api().post(f"{honest[0].url}/api/jobs/{job_id}/cancel", json={}, timeout=60)
        assert response.status_code < 300, response.text
    else:
        pytest.fail(f"no usable committee in {MAX_DRAWS} draws: {draws}")
    scorer = next(m for m in pair if m.address in committee)
    roles = Roles(committee, trainer=next(m for m in pair if m is not scorer), scorer=scorer)
    report = Report()
    attackers = HostilePair(
        w3,
        deployment,
        peers,
        [n.address for n in honest],
        job_id,
        roles,
        report,
        hijack=proposals_bind_reference(),
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
            {"draws": len(draws), "seconds": seconds, "timings": TIMINGS, "attempts": report.attempts},
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
        "models": Models(roles.trainer, peers, log),
        "honest": [n.address for n in honest],
        "bomb_root": hex_of(bomb_root),
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
    scored 0 by every honest member (it does not open to that hash), never accepted."""
    attempts, log = run["report"].attempts, run["log"]
    assert attempts["exact_copy"]["status"] == 0 and attempts["exact_copy"]["error"] == "DuplicateContent", (
        attempts
    )
    assert attempts["copy_other_hash"]["status"] == 1, attempts
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
    medians = dict(zip((a.lower() for a in finalized["ranking"]), finalized["medians"], strict=True))
    assert medians[partner] == 0, medians
    assert partner not in [a.lower() for a in finalized["accepted"]]

    trainers = [a.lower() for a in finalized["ranking"]]
    base = {e.args["member"].lower(): int(e.args["baseScore"]) for e in log.events("ScoresSubmitted", 1)}
    rule = dict(top_k=2, committee_size=3, base_scores=base, margin=int(finalized["margin"]))
    outcome = decide_round(trainers, scores, **rule)
    assert partner not in outcome.accepted and outcome.medians == medians
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


def test_a_silent_committee_seat_does_not_stall_the_job(run):
    """Round 2's scoring committee holds the round-1 trainer, which never commits or reveals: the
    round finalizes on the two honest reveals after the commit deadline. Round 2's aggregating
    committee holds the round-1 scorer, which never proposes or confirms: the two honest members
    fix the model."""
    roles, log = run["roles"], run["log"]
    silent_scorer, silent_voter = roles.trainer.address.lower(), roles.scorer.address.lower()
    round2_committee = [a.lower() for a in log.events("RoundFinalized", 1)[0].args["nextCommittee"]]
    assert silent_scorer in round2_committee, round2_committee
    assert silent_scorer not in {e.args["member"].lower() for e in log.events("ScoresCommitted", 2)}
    # Both honest members reveal after the commit deadline, at about the same time: the one mined
    # second finalizes (its gas must cover that: backend/ledger/contracts.finalize_headroom).
    revealed = {e.args["member"].lower() for e in log.events("ScoresSubmitted", 2)}
    assert revealed == set(round2_committee) - {silent_scorer}, (revealed, round2_committee)
    assert log.events("RoundFinalized", 2), "round 2 never finalized"
    aggregators = [a.lower() for a in log.events("RoundFinalized", 2)[0].args["nextCommittee"]]
    assert silent_voter in aggregators, aggregators
    voters = {e.args["proposer"].lower() for e in log.events("GlobalModelProposed", 2)}
    voters |= {e.args["member"].lower() for e in log.events("GlobalModelConfirmed", 2)}
    assert silent_voter not in voters and len(voters) == 2, voters
    assert log.events("GlobalModelFixed", 2), "round 2's model was not fixed"
    assert run["report"].attempts["round2_garbage"]["status"] == 1


@pytest.mark.xfail(
    not proposals_bind_reference(),
    reason="proposals are keyed by the model hash alone (issue 14, helper 'chain'): a right hash "
    "with a bogus reference would be confirmed by honest members, so the attack is not sent",
    strict=True,
)
def test_a_hijacked_proposal_is_never_fixed(run):
    """The round-1 trainer, on the aggregating committee, proposed the right model hash with the
    span bomb's reference (as soon as the round aggregated; whether before the honest seat 0 is
    printed). No honest member voted for that pair; the model fixed has the reference of the
    aggregate's honest bytes."""
    hijack, log = run["report"].attempts["hijack"], run["log"]
    assert hijack["sent"] and hijack["status"] == 1, hijack
    proposed = log.events("GlobalModelProposed", 1)
    first = min(proposed, key=lambda e: (e.block_number, e.log_index))
    # Reported, not asserted: the hijacker races the honest seat 0 (timing is not a defence).
    print(json.dumps({"hijack_proposed_first": first.args["proposer"] == run["roles"].trainer.address}))
    hijacks = [p for p in proposed if p.args["proposer"].lower() == run["roles"].trainer.address.lower()]
    assert [hex_of(p.args["modelRef"]) for p in hijacks] == [hex_of(run["bomb_root"])], proposed
    bogus = hex_of(keccak(raw(run["bomb_root"])))
    for confirmation in log.events("GlobalModelConfirmed", 1):
        assert hex_of(confirmation.args.get("referenceDigest", "0x")) != bogus, confirmation
    fixed = log.events("GlobalModelFixed", 1)[0].args
    assert hex_of(fixed["modelHash"]) == hijack["model_hash"]  # the hash was right
    assert hex_of(fixed["referenceDigest"]) == hex_of(keccak(raw(hijack["honest_reference"])))
    assert fixed["proposer"].lower() != run["roles"].trainer.address.lower()


def test_every_fixed_model_is_the_honest_aggregation_and_every_node_holds_it(federation, run):
    log, models = run["log"], run["models"]
    honest = {h.lower() for h in run["honest"]}
    fixed = {int(e.args["round"]): hex_of(e.args["modelHash"]) for e in log.events("GlobalModelFixed")}
    assert sorted(fixed) == list(range(1, ROUNDS + 1)), fixed
    for number, model_hash in fixed.items():
        accepted = [a.lower() for a in log.events("RoundFinalized", number)[0].args["accepted"]]
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
