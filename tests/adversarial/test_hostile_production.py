"""A hostile minority on a production deployment cannot choose committees or inflate weights (issue 32).

Three honest organizations on anvil, the contracts deployed with production flags (no
``allow_small_committees``: committees odd and at least 3), and three hostile keys (``HostileMember``:
their own keys, raw transactions, signed peer requests, one key server as their endpoint), admitted
as members. Two jobs run on the one federation, each with a committee of 3; what the keys do is in
``production_attacks.py``:

The draws job (Mallory proposes it; Mallory, Trudy and Victor collude):
1. The grinding proposer: with the honest nodes cut off from the chain, Mallory starts the job in
   block after block (anvil snapshots; every participant reveals its committed draw secret in each
   attempt) and gets the same committee and seed every time, the one the real start then draws:
   the block it starts in cannot change the draw, so it cannot seat its colluders more often than
   chance. Withholding a draw secret (tried and undone) takes the withholder out of the job
   (NotDrawn), it does not re-roll it in.
2. The grinding skipper: round 1 finalized, no vote possible, the clock past the aggregation
   deadline: ``skipAggregation`` sent in block after block draws one committee, the one the
   round's seed fixed (fl_node.committee.skip_seed), in every attempt.
3. The capture: round 1 seats at least two colluders (the job is proposed again until its draw
   does: a test's setup, as a real proposer cannot see the honest secrets before they are
   revealed); they score their accomplices' junk 10000 and everyone else 0, and it is accepted. The
   next committee is still the uniform draw of the round's seed, every round, not the ranking that
   would elect the accomplices; the honest nodes finish the job.

The weights job (an honest node proposes it):
4. The two-key blob: a sealed update whose header commits to one key while its trainer hands out
   another first (the one that opens it to a good update): every honest node refuses it the same
   way (scored 0, not aggregated) and the round is not skipped.
5. The inflated dataset: Mallory and Trudy registered 10^12 samples and claim them in good updates:
   an accepted one's share of the aggregate is at most the job's max_share_bp (bounded influence,
   fl_node.aggregate.bounded_weights), and the uncapped share would have given another model.
6. The drained grant: Victor joined with an honest provider's dataset it was granted; the provider
   revokes the grant once round 1 is finalized, and every later spend of Victor's reverts on chain
   (GrantRevoked): its releases from the dataset stop. The honest nodes finish.
In the weights job a seated hostile key rubber-stamps every update but the two-key blob, and the
keys' trainer slots serve whichever scene is still missing (production_attacks.Intruders), so the
scenes happen whatever the fair draw seats.
Both jobs end with every fixed model the honest members' aggregation (the job's default defense) of
the accepted updates, recomputed here from the blobs, and held by every honest node.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from math import comb

import pytest
from eth_account import Account
from web3 import HTTPProvider, Web3

from backend.ledger.abi import EventDecoder
from backend.ledger.chains import ensure_funds
from backend.ledger.client import ChainClient
from backend.ledger.contracts import DataRegistry, FederatedLearning, NodeRegistry
from backend.ledger.deployment import load_deployment
from backend.ledger.resources import JobSpec
from devnet.localnet import NodeSpec
from fl_node.aggregate import bounded_weights
from fl_node.codec import content_hash
from fl_node.committee import draw_committee, first_seed, mix_in
from tests.adversarial.hostile_member import HostileMember, KeyServer, Peer
from tests.adversarial.production_attacks import GRIND_BLOCKS, INFLATED, Coalition, Intruders, Log
from tests.adversarial.protocol_attacks import ChainLog, Models, hex_of, lower, raw, wait_for
from tests.faults.faultnet import ProxiedFederation
from tests.jobs.jobs_helpers import digits_parts

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(3600),
]

TRAIN_S = 40  # round_timeout_s
SCORE_S = 40  # score_timeout_s: commits in its first half; also each round's aggregation time
ROUNDS = 3  # the draws job's: a skipped round 1 still leaves a round for the committee it draws
# The weights job's: its scenes need two trainer slots of the hostile keys (one of them Mallory's or
# Trudy's), which the uniform draw of 3 seats from 6 keys leaves them in 5 rounds but for ~0.2%.
WEIGHTS_ROUNDS = 5
MAX_PROPOSALS = 12  # draws jobs proposed until round 1 seats two colluders (p = 0.5 a proposal)
RUN_TIMEOUT_S = 1500
CAP_EPSILON = 90.0


def _payload(dataset_id: int, name: str, top_k: int, rounds: int = ROUNDS) -> dict:
    return {
        "name": name,
        "model": "mlp",
        "dataset": dataset_id,
        "rounds": rounds,
        "local_epochs": 2,
        "batch_size": 32,
        "lr": 0.5,
        "strategy": "fedavg",
        "dp": {"mode": "sgd", "target_epsilon": 8.0, "delta": 1e-5, "max_grad_norm": 1.0},
        "committee_size": 3,
        "top_k": top_k,
        "min_trainers": 1,
        "round_timeout_s": TRAIN_S,
        "score_timeout_s": SCORE_S,
    }


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    specs = [NodeSpec("org-a"), NodeSpec("org-b"), NodeSpec("org-c")]
    # Production flags; the nodes reach the chain through a proxy the grinding attempts turn dark.
    with ProxiedFederation(
        tmp_path_factory.mktemp("hostile-production"),
        specs,
        agent_interval=1.0,
        allow_small_committees=False,
        log=lambda _line: None,
    ) as fed:
        yield fed


@pytest.fixture(scope="module")
def keys():
    server = KeyServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def consortium(federation, keys):
    """The three hostile keys admitted (the honest members vote them in, the admitted ones vote for
    the next), the honest datasets uploaded, the hostile ones registered: Mallory's and Trudy's
    claim 10^12 samples."""
    honest = federation.nodes
    w3 = Web3(HTTPProvider(federation.anvil.url, request_kwargs={"timeout": 60}))
    deployment = load_deployment(federation.root / "contracts.json")
    assert deployment is not None
    fl = FederatedLearning(deployment.address("FederatedLearning"), ChainClient(w3, Account.create()))
    assert not fl.allow_small_committees(), "not a production deployment"
    names = ("mallory", "trudy", "victor")
    hostile = {name: HostileMember(w3, deployment) for name in names}
    for name, member in hostile.items():
        ensure_funds(w3, member.address)
        assert member.register_node(name, keys.url)["status"] == 1
    registry = NodeRegistry(deployment.address("NodeRegistry"), ChainClient(w3, Account.create()))

    def vote_in(voter) -> None:  # one voter's votes in order (one key), the voters at once
        for member in hostile.values():
            voter.web.manage("node", "admit", member.address, check=False)

    def upload(node, part) -> dict:
        x, y = part
        return federation.upload_dataset(
            node, x, y, name=f"{node.spec.name}-digits", classes=range(10), epsilon_cap=CAP_EPSILON
        )

    with ThreadPoolExecutor(len(honest)) as pool:
        for _ in range(4):  # a vote lost on a loaded machine is sent again
            list(pool.map(vote_in, honest))
            for _ in range(len(hostile)):  # admitted hostile members vote for the others
                admitted = [m for m in hostile.values() if registry.is_member(m.address)]
                for applicant in (m for m in hostile.values() if m not in admitted):
                    for voter in admitted:
                        voter.call("NodeRegistry", "voteAdmission", applicant=applicant.address)
            if all(registry.is_member(m.address) for m in hostile.values()):
                break
        assert all(registry.is_member(m.address) for m in hostile.values()), (
            "the hostile keys were not admitted"
        )
        datasets = list(pool.map(upload, honest, digits_parts(len(honest), seed=3)))
    samples = {"mallory": INFLATED, "trudy": INFLATED, "victor": 200}
    schema = datasets[0]["schema_hash"]  # the honest data's: a job of it counts these members in
    own = {
        name: hostile[name].register_dataset(samples[name], 90_000_000, schema_hash=schema) for name in names
    }
    return {
        "w3": w3,
        "deployment": deployment,
        "honest": honest,
        "peers": [Peer(node.url, node.address) for node in honest],
        "hostile": hostile,
        "datasets": datasets,
        "own": own,
        "samples": {hostile[name].address.lower(): n for name, n in samples.items()},
    }


# ----------------------------------------------------------------------------- the draws job


def _spec_of(log: ChainLog, w3: Web3) -> JobSpec:
    """The template job's spec (its config and initial model are in the swarm, the honest nodes'
    own), with a join deadline from now: what Mallory proposes as its own."""
    spec = log.events("JobProposed")[0].args["spec"]
    now = int(w3.eth.get_block("latest")["timestamp"])
    return JobSpec(
        config_hash=raw(spec["configHash"]),
        initial_model_ref=raw(spec["initialModelRef"]),
        initial_model_hash=raw(spec["initialModelHash"]),
        rounds=int(spec["rounds"]),
        committee_size=int(spec["committeeSize"]),
        top_k=int(spec["topK"]),
        min_trainers=int(spec["minTrainers"]),
        join_deadline=now + 3600,
        train_period=int(spec["trainPeriod"]),
        score_period=int(spec["scorePeriod"]),
        use_blocks=bool(spec["useBlocks"]),
        max_spend_per_round=int(spec["maxSpendPerRound"]),
        margin=int(spec["margin"]),
    )


@pytest.fixture(scope="module")
def draws(federation, keys, consortium):
    started = time.monotonic()
    c = consortium
    w3, deployment, honest, hostile = c["w3"], c["deployment"], c["honest"], c["hostile"]
    members = [hostile["mallory"], hostile["trudy"], hostile["victor"]]
    colluders = {m.address.lower() for m in members}
    honest_keys = [node.web.private_key for node in honest]
    template = federation.create_job(honest[0], _payload(c["datasets"][0]["id"], "draws-template", 2))
    spec = _spec_of(ChainLog(w3, deployment, int(template["id"])), w3)
    cancelled = honest[0].api().post(f"{honest[0].url}/api/jobs/{template['id']}/cancel", json={}, timeout=60)
    assert cancelled.status_code < 300, cancelled.text
    log = Log()
    proposals = []
    for _ in range(MAX_PROPOSALS):
        receipt, job_id = hostile["mallory"].propose_job(spec)
        assert job_id is not None, receipt
        for node, dataset in zip(honest, c["datasets"], strict=True):
            federation.join(node, job_id, dataset["id"])
        for member in members:
            name = next(n for n, m in hostile.items() if m is member)
            assert member.join(job_id, c["own"][name])["status"] == 1
        assert federation.wait_prepared(job_id, timeout_s=600), "a node did not prepare round 1"
        coalition = Coalition(
            w3,
            deployment,
            c["peers"],
            [n.address for n in honest],
            federation.proxy,
            job_id,
            keys,
            log,
            samples=c["samples"],
            timeout_s=RUN_TIMEOUT_S,
            members=members,
            rounds=ROUNDS,
        )
        attempts = coalition.grind_start(honest_keys, GRIND_BLOCKS[:1])
        proposals.append({"job": job_id, "committee": attempts[0]["committee"]})
        if len(set(attempts[0]["committee"]) & colluders) >= 2:
            break
        assert hostile["mallory"].call("FederatedLearning", "cancel", jobId=job_id)["status"] == 1
    else:
        pytest.fail(f"no draw seated two colluders in {MAX_PROPOSALS} proposals: {proposals}")
    attempts += coalition.grind_start(honest_keys, GRIND_BLOCKS[1:])
    withheld = coalition.withhold(honest_keys, hostile["victor"])
    # The real start: the honest nodes see it, reveal their own secrets, and the chain draws.
    start = hostile["mallory"].call("FederatedLearning", "startJob", jobId=job_id)
    assert start["status"] == 1, start
    threads = coalition.start()
    for member in members:
        assert member.reveal_draw(job_id)["status"] == 1
    chain = ChainLog(w3, deployment, job_id)
    real = wait_for(lambda: chain.events("JobStarted"), 300, "the real draw")[0].args
    final = federation.wait_for_job(job_id, timeout_s=RUN_TIMEOUT_S)
    for thread in threads:
        thread.join(120)
    secrets = {
        node.address.lower(): _honest_secret(w3, deployment, node.web.private_key, job_id) for node in honest
    }
    secrets |= {m.address.lower(): m.draw_secrets[job_id] for m in members}
    report = {
        "job_id": job_id,
        "job": final,
        "proposals": proposals,
        "attempts": attempts,
        "withheld": withheld,
        "withholder": hostile["victor"].address.lower(),
        "start_block": int(start["blockNumber"]),
        "real": {"committee": lower(real["committee"]), "seed": hex_of(real["seed"])},
        "secrets": secrets,
        "log": log,
        "chain": chain,
        "colluders": colluders,
        "honest": {n.address.lower() for n in honest},
        "models": Models(members[0], c["peers"], chain, keys),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(
        "HOSTILE DRAWS "
        + json.dumps(
            {k: report[k] for k in ("job_id", "proposals", "attempts", "withheld", "real", "seconds")}
            | {"seen": log.seen, "errors": log.errors},
            default=str,
        )
    )
    return report


def _honest_secret(w3, deployment, private_key: str, job_id: int) -> bytes:
    client = ChainClient(w3, Account.from_key(private_key))
    return FederatedLearning(deployment.address("FederatedLearning"), client).draw_secret(job_id)


def test_the_draws_job_ran_to_its_end(draws):
    assert not draws["log"].errors, draws["log"].errors
    assert draws["job"]["status"] == "finished", draws["job"]


def test_a_grinding_proposer_gets_one_committee_whatever_block_it_starts_in(draws):
    """Every attempt started the job in another block (number, timestamp and prevrandao differ)
    and drew the same committee with the same seed, the draw of the committed secrets alone
    (fl_node.committee.first_seed over their mix); the real start drew it again. So the proposer
    got one draw, as everyone does: its colluders sit as often as chance seats them."""
    attempts, real, chain = draws["attempts"], draws["real"], draws["chain"]
    assert len(attempts) == len(GRIND_BLOCKS)
    for what in ("start_block", "start_timestamp", "prevrandao"):
        assert len({a[what] for a in attempts}) == len(attempts), (what, attempts)
    assert {tuple(a["committee"]) for a in attempts} == {tuple(real["committee"])}, (attempts, real)
    assert {a["seed"] for a in attempts} == {real["seed"]}
    mix = bytes(32)
    for address, secret in draws["secrets"].items():
        mix = mix_in(mix, secret, address)
    seed = first_seed(mix, draws["job_id"])
    assert hex_of(seed) == real["seed"]
    participants = chain.drawn()
    assert sorted(participants) == sorted(draws["secrets"])
    assert draw_committee(seed, participants, 3) == real["committee"]
    seated = len(set(real["committee"]) & draws["colluders"])
    fair = sum(k * comb(3, k) * comb(3, 3 - k) for k in range(4)) / comb(6, 3)
    print(
        json.dumps(
            {"colluders_seated": seated, "fair_expectation": fair, "proposals": len(draws["proposals"])}
        )
    )


def test_withholding_a_draw_secret_removes_the_withholder_rather_than_re_rolling_it(draws):
    """A colluder that keeps its secret back (the last revealer's only choice) cannot draw early
    (DrawNotOverdue) nor reveal late (DeadlinePassed); anyone then draws from the others, and the
    withholder is out of the job: it can neither train nor spend (NotDrawn), and sits on no
    committee, this one or any later (it is no participant the draw reads)."""
    withheld, withholder = draws["withheld"], draws["withholder"]
    assert withheld["before_deadline"] == "DrawNotOverdue", withheld
    assert withheld["late_reveal"] == "DeadlinePassed", withheld
    assert withheld["status"] == 1 and len(withheld["committee"]) == 3, withheld
    assert withholder not in withheld["committee"], withheld
    assert withheld["withholder_update"] == "NotDrawn", withheld
    assert withheld["withholder_spend"] == "NotDrawn", withheld
    others = {a: s for a, s in draws["secrets"].items() if a != withholder}
    mix = bytes(32)
    for address, secret in others.items():
        mix = mix_in(mix, secret, address)
    assert withheld["committee"] == draw_committee(first_seed(mix, draws["job_id"]), list(others), 3)


def test_a_grinding_skipper_gets_the_committee_the_rounds_seed_fixed(draws):
    """Round 1 finalized, the clock past its aggregation deadline: skipAggregation in one block
    after another drew the same committee with the same seed each time, the draw of
    skip_seed(RoundFinalized.seed); before the deadline it was refused (AggregationNotOverdue)."""
    skipper = draws["log"].seen.get("skipper")
    assert skipper, "round 1 was not finalized by a colluder's reveal"
    assert skipper["too_early"] == "AggregationNotOverdue", skipper
    attempts = skipper["attempts"]
    assert len(attempts) == len(GRIND_BLOCKS) and all(a["status"] == 1 for a in attempts), attempts
    assert len({a["block"] for a in attempts}) == len(attempts), attempts
    assert {tuple(a["committee"]) for a in attempts} == {tuple(skipper["expected"])}, skipper
    assert len(skipper["expected"]) == 3 and len({a["seed"] for a in attempts}) == 1, skipper


def test_a_captured_committee_does_not_elect_its_accomplices(draws):
    """Round 1 seated two or three colluders: the accomplices' junk got their 10000 (median 10000),
    every honest update 0 (rejected), and nothing but junk was accepted. Every round's next committee is nevertheless
    the uniform draw of its seed over the participants (fl_node.committee.draw_committee), not the
    ranking, which would have seated the accomplices first."""
    chain, colluders = draws["chain"], draws["colluders"]
    committee = lower(chain.events("RoundOpened", 1)[0].args["committee"])
    assert len(set(committee) & colluders) >= 2, committee
    (round_one,) = chain.events("RoundFinalized", 1)
    medians = dict(zip(lower(round_one.args["trainers"]), round_one.args["medians"], strict=True))
    accomplices = [t for t in medians if t in colluders]  # none when all three sit
    assert len(accomplices) == 3 - len(set(committee) & colluders), (accomplices, committee)
    assert all(medians[t] == 10_000 for t in accomplices), medians
    assert all(medians[t] == 0 for t in medians if t not in colluders), medians
    assert set(lower(round_one.args["accepted"])) <= colluders, round_one.args
    seats = []
    for event in chain.events("RoundFinalized"):
        round_ = int(event.args["round"])
        drawn = draw_committee(raw(event.args["seed"]), chain.drawn(), 3, banned=chain.banned(round_))
        assert lower(event.args["nextCommittee"]) == drawn, (round_, event.args)
        ranked = lower(event.args["accepted"])
        seats.append(
            {
                "round": round_,
                "next": drawn,
                "ranking_would_seat": ranked[:3],
                "colluders": len(set(drawn) & colluders),
            }
        )
    print(json.dumps({"next_committees": seats}))


def _fixed_models_check(federation, report) -> dict[int, str]:
    chain, models = report["chain"], report["models"]
    fixed = {int(e.args["round"]): hex_of(e.args["modelHash"]) for e in chain.events("GlobalModelFixed")}
    skipped = {int(e.args["round"]) for e in chain.events("AggregationSkipped")}
    finalized = {int(e.args["round"]) for e in chain.events("RoundFinalized")}
    assert fixed and set(fixed) | skipped == finalized and not set(fixed) & skipped, (fixed, skipped)
    for number, model_hash in fixed.items():
        expected = models.expected(number)
        assert "0x" + content_hash(expected) == model_hash, number
        assert models.blob(models.fixed(number)[0]) == expected, number
        # Every honest member's vote (those cast before the model was fixed) is for that model: a
        # hostile majority voting for it fixed nothing the honest members would not have.
        for vote in chain.events("GlobalModelVoted", number):
            if vote.args["member"].lower() in report["honest"]:
                assert hex_of(vote.args["modelHash"]) == model_hash, (number, vote.args)
    job_id = report["job_id"]
    for node in federation.nodes:
        listed = node.api().get(f"{node.url}/api/models", params={"limit": 500}, timeout=60).json()
        items = listed["results"] if isinstance(listed, dict) else listed
        held = {int(m["round"]): m for m in items if int(m["job"]) == job_id}
        assert set(held) == set(fixed), (node.spec.name, sorted(held))
        for number, model in held.items():
            blob = node.api().get(f"{node.url}/api/models/{model['id']}/download", timeout=120)
            assert blob.status_code == 200
            assert "0x" + content_hash(blob.content) == fixed[number], (node.spec.name, number)
    return fixed


def test_the_draws_jobs_models_are_the_honest_aggregation_on_every_node(federation, draws):
    _fixed_models_check(federation, draws)


# ----------------------------------------------------------------------------- the weights job


@pytest.fixture(scope="module")
def weights(federation, keys, consortium, draws):
    started = time.monotonic()
    c = consortium
    w3, deployment, honest, hostile = c["w3"], c["deployment"], c["honest"], c["hostile"]
    victor = hostile["victor"]
    provider, granted = honest[1], c["datasets"][1]
    grant = provider.api().post(
        f"{provider.url}/api/datasets/{granted['id']}/grants", json={"node": victor.address}, timeout=120
    )
    assert grant.status_code == 201, grant.text
    onchain = int(
        provider.api().get(f"{provider.url}/api/datasets/{granted['id']}", timeout=60).json()["onchain_id"]
    )
    data = DataRegistry(deployment.address("DataRegistry"), ChainClient(w3, Account.create()))
    samples = dict(c["samples"]) | {victor.address.lower(): data.get_dataset(onchain).samples}
    job = federation.create_job(honest[0], _payload(c["datasets"][0]["id"], "weights", 3, WEIGHTS_ROUNDS))
    job_id = int(job["id"])
    for node, dataset in zip(honest, c["datasets"], strict=True):
        federation.join(node, job_id, dataset["id"])
    members = [hostile["mallory"], hostile["trudy"], victor]
    assert hostile["mallory"].join(job_id, c["own"]["mallory"])["status"] == 1
    assert hostile["trudy"].join(job_id, c["own"]["trudy"])["status"] == 1
    assert victor.join(job_id, onchain)["status"] == 1
    assert federation.wait_prepared(job_id, timeout_s=600), "a node did not prepare round 1"
    log = Log()

    def revoke() -> dict:
        response = provider.api().delete(
            f"{provider.url}/api/datasets/{granted['id']}/grants/{victor.address}", timeout=120
        )
        assert response.status_code == 200, response.text
        return response.json()

    intruders = Intruders(
        w3,
        deployment,
        c["peers"],
        [n.address for n in honest],
        federation.proxy,
        job_id,
        keys,
        log,
        samples=samples,
        timeout_s=RUN_TIMEOUT_S,
        members=members,
        grantee=victor,
        rounds=WEIGHTS_ROUNDS,
        revoke=revoke,
    )
    federation.start_job(honest[0], job_id)
    threads = intruders.start()
    for member in members:
        assert member.reveal_draw(job_id)["status"] == 1
    final = federation.wait_for_job(job_id, timeout_s=RUN_TIMEOUT_S)
    for thread in threads:
        thread.join(120)
    chain = ChainLog(w3, deployment, job_id)
    report = {
        "job_id": job_id,
        "job": final,
        "log": log,
        "chain": chain,
        "models": Models(members[0], c["peers"], chain, keys),
        "keys": keys,
        "victor": victor.address.lower(),
        "victor_key": bytes(victor.account.key),
        "granted": onchain,
        "data": data,
        "honest": {n.address.lower() for n in honest},
        "hostile": {m.address.lower() for m in members},
        "seconds": round(time.monotonic() - started, 1),
    }
    print(
        "HOSTILE WEIGHTS "
        + json.dumps(
            {
                "job_id": job_id,
                "seconds": report["seconds"],
                "seen": log.seen,
                "rounds": log.rounds,
                "errors": log.errors,
            },
            default=str,
        )
    )
    return report


def _scenes(report: dict) -> str:
    """What the hostile keys did each round and whom each round seated: why a scene did not happen."""
    chain = report["chain"]
    seats = {int(e.args["round"]): lower(e.args["committee"]) for e in chain.events("RoundOpened")}
    return json.dumps({"committees": seats, "log": report["log"].rounds, "seen": sorted(report["log"].seen)})


def test_the_weights_job_ran_to_its_end(weights):
    assert not weights["log"].errors, weights["log"].errors
    assert weights["job"]["status"] == "finished", weights["job"]


def test_a_two_key_blob_is_refused_the_same_way_by_every_honest_node(weights):
    """The blob commits to one key and its trainer hands every reader the other one first (it
    opens the blob to a good update) and the committed one after (it opens nothing): the first is
    the holder's error everywhere (KeyMismatch), the second the trainer's (WrongContent). Every
    honest member scored it 0, it was not accepted, and the round's model was fixed all the same."""
    two_key, chain = weights["log"].seen.get("two_key"), weights["chain"]
    assert two_key, f"no hostile key trained: the two-key blob was never sent; {_scenes(weights)}"
    assert two_key["status"] == 1, two_key
    round_, trainer = two_key["round"], two_key["member"]
    honest = weights["honest"]
    scores = {
        e.args["member"].lower(): dict(zip(lower(e.args["trainers"]), e.args["scores"], strict=True))
        for e in chain.events("ScoresSubmitted", round_)
    }
    honest_scorers = [m for m in scores if m in honest]
    assert honest_scorers, scores
    assert all(scores[m].get(trainer, 0) == 0 for m in honest_scorers), scores
    (finalized,) = chain.events("RoundFinalized", round_)
    medians = dict(zip(lower(finalized.args["trainers"]), finalized.args["medians"], strict=True))
    assert medians[trainer] == 0 and trainer not in lower(finalized.args["accepted"]), finalized.args
    assert chain.events("GlobalModelFixed", round_) and not chain.events("AggregationSkipped", round_)
    asked = [
        requester
        for job, number, of, requester in weights["keys"].asked
        if (job, number, of) == (weights["job_id"], round_, trainer)
    ]
    for scorer in honest_scorers:  # each was handed the wrong key first, and asked again
        assert asked.count(scorer) >= 2, (scorer, asked)
    print(json.dumps({"two_key_round": round_, "asked": {a: asked.count(a) for a in set(asked)}}))


def test_an_inflated_dataset_gets_at_most_the_jobs_share(weights):
    """An accepted update claiming 10^12 samples weighs at most max_share_bp of the aggregate
    (fl_node.aggregate.bounded_weights, in every honest node's aggregation: the fixed model is the
    capped aggregation, recomputed here); uncapped, its share would have been all but the whole,
    and the model another."""
    chain, models = weights["chain"], weights["models"]
    cap = models.config.max_share_bp
    checked = []
    for event in chain.events("RoundFinalized"):
        round_ = int(event.args["round"])
        submitted = {e.args["trainer"].lower(): e for e in chain.events("UpdateSubmitted", round_)}
        accepted = []
        seen_hashes: set[str] = set()
        for trainer in lower(event.args["accepted"]):
            chash = hex_of(submitted[trainer].args["contentHash"])
            if chash not in seen_hashes:
                seen_hashes.add(chash)
                accepted.append((trainer, int(submitted[trainer].args["samples"])))
        if not any(samples == INFLATED for _, samples in accepted):
            continue
        weights_ = bounded_weights([s for _, s in accepted], cap)
        total = sum(weights_)
        for (_, samples), weight in zip(accepted, weights_, strict=True):
            if samples != INFLATED:
                continue
            if len(accepted) * cap <= 10_000:
                # Too few updates for any to stay under the cap (one accepted alone weighs the
                # whole): every accepted update weighs the same, the inflated one no more.
                assert weight * len(accepted) == total, (round_, accepted, weights_)
            else:
                assert weight * 10_000 <= cap * total, (round_, accepted, weights_)
        fixed = chain.events("GlobalModelFixed", round_)
        assert fixed, f"round {round_} was not fixed"
        assert hex_of(fixed[0].args["modelHash"]) == "0x" + content_hash(models.expected(round_))
        claimed = [s for _, s in accepted]
        # The cap changed the shares (not so when every accepted update claims the same, e.g. both
        # inflated ones alone): the uncapped aggregation is then another model.
        if any(c * total != w * sum(claimed) for c, w in zip(claimed, weights_, strict=True)):
            uncapped = models.expected(round_, max_share_bp=10_000)
            assert "0x" + content_hash(uncapped) != hex_of(fixed[0].args["modelHash"]), round_
        checked.append({"round": round_, "accepted": accepted, "weights": weights_})
    assert checked, (
        f"no update claiming 10^12 samples was accepted: bounded influence was not exercised; {_scenes(weights)}"
    )
    print(json.dumps({"max_share_bp": cap, "rounds": checked}))


def test_a_revoked_grant_stops_the_grantees_releases(weights):
    """Victor spent from the granted dataset before the revocation (its grant counts it); after
    it, every spend it sends reverts (GrantRevoked) and none is recorded: its releases stopped,
    and the honest nodes finished the job."""
    chain, victor, dataset = weights["chain"], weights["victor"], weights["granted"]
    revocation = weights["log"].seen.get("revocation")
    assert revocation, "the grant was never revoked"
    w3 = chain.w3
    revoked_block = int(w3.eth.get_transaction_receipt(revocation["revoke_tx_hash"])["blockNumber"])
    spends = [
        e
        for e in _data_events(w3, weights, "PrivacySpent")
        if int(e.args["datasetId"]) == dataset and e.args["spender"].lower() == victor
    ]
    assert spends and all(e.block_number < revoked_block for e in spends), [e.block_number for e in spends]
    tries = [r for r in weights["log"].rounds if r["kind"] == "spend_after_revocation"]
    assert tries, "the grantee never tried to spend after the revocation"
    for attempt in tries:
        assert attempt["spend_status"] == 0 and attempt["spend_refusal"] == "GrantRevoked", attempt
        assert attempt["update_refusal"] in ("GrantRevoked", "CommitteeCannotTrain"), attempt
    grant = weights["data"].get_grant(dataset, victor)
    assert not grant.active and grant.spent == sum(int(e.args["amount"]) for e in spends), grant
    assert weights["job"]["status"] == "finished"


def test_the_revocation_rotated_the_data_key(weights):
    """The provider's node rotated the dataset's key on the revocation: one DatasetKeyRotated,
    after the revocation, to the root the chain now holds; Victor's wrapped key (read from its
    AccessGranted event and opened with its own key) names the retired root, not that one."""
    from backend.datasets.keys import unwrap_key

    chain, victor, dataset = weights["chain"], weights["victor"], weights["granted"]
    w3 = chain.w3
    revoked_block = int(
        w3.eth.get_transaction_receipt(weights["log"].seen["revocation"]["revoke_tx_hash"])["blockNumber"]
    )
    rotations = [
        e for e in _data_events(w3, weights, "DatasetKeyRotated") if int(e.args["datasetId"]) == dataset
    ]
    assert len(rotations) == 1 and rotations[0].block_number >= revoked_block, rotations
    new_root = hex_of(rotations[0].args["swarmRef"]).removeprefix("0x")
    assert hex_of(weights["data"].get_dataset(dataset).swarm_ref).removeprefix("0x") == new_root
    granted = [
        e
        for e in _data_events(w3, weights, "AccessGranted")
        if int(e.args["datasetId"]) == dataset and e.args["grantee"].lower() == victor
    ]
    assert granted, "no grant to Victor on chain"
    old_reference = unwrap_key(weights["victor_key"], raw(granted[-1].args["wrappedKey"]))
    assert old_reference[:64] != new_root


def _data_events(w3, weights, name: str) -> list:
    """DataRegistry's ``name`` events, decoded (a small chain: read from block 0)."""
    decoder = EventDecoder()
    logs = w3.eth.get_logs({"fromBlock": 0, "address": weights["data"].address})
    return [e for e in (decoder.decode(log) for log in logs) if e is not None and e.name == name]


def test_the_weights_jobs_models_are_the_honest_aggregation_on_every_node(federation, weights):
    _fixed_models_check(federation, weights)
