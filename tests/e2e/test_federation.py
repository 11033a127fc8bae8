"""Four organizations train one model with DP, with no central server (real processes).

org-a runs on MariaDB with its round actions on a Celery worker (Redis); the others on
SQLite in-process; org-d is a label-flipping attacker. The nodes meet only on an anvil
chain and in the swarm store they form. The job runs with adaptive local work (issue 18):
each node's AIMD controller sets its steps per round, each round is charged for the steps
it ran, and every aggregate is FedNova's over the updates' claimed steps.
"""

from __future__ import annotations

import sqlite3
from urllib.parse import urlparse

import pytest
import requests
import torch
from web3 import HTTPProvider, Web3

from backend.jobs.driver import adaptive_work
from backend.jobs.sealed import envelope
from backend.ledger.abi import EventDecoder
from devnet.localnet import LocalFederation, NodeSpec
from fl_node.aggregate import WeightedUpdate, bounded_weights, get_strategy
from fl_node.codec import content_hash, decode_model, decode_update, encode_model, update_spec
from fl_node.data import load_dataset
from fl_node.job import training
from fl_node.job.config import JobConfig
from fl_node.models import create_model
from fl_node.normalized_average import WorkUpdate, normalized_average, work_norm
from fl_node.partition import partition
from fl_node.train import evaluate

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.slow,
]

ROUNDS = 5
EPSILON = 3.0
CAP = 3.5
# Adaptive work: nominal steps a quarter of the bound, 15 = one epoch of a node's ~900 records at
# batch 64 (the work the job ran with fixed epochs); rounds far shorter than half the 300 s
# timeout get more work, up to the bound.
MAX_LOCAL_STEPS = 60
NOMINAL_STEPS = MAX_LOCAL_STEPS // 4


def _hex(value: str) -> str:
    return value.lower().removeprefix("0x")


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    specs = [
        NodeSpec("org-a", database="mariadb", celery=True),
        NodeSpec("org-b"),
        NodeSpec("org-c"),
        NodeSpec("org-d", attack="label_flip"),
    ]
    with LocalFederation(tmp_path_factory.mktemp("federation"), specs, log=lambda _line: None) as fed:
        yield fed


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist", seed=0)


@pytest.fixture(scope="module")
def finished_job(federation, mnist):
    parts = partition(mnist.train.y, len(federation.nodes), "iid", seed=0)
    datasets = [
        federation.upload_dataset(
            node,
            mnist.train.x[p],
            mnist.train.y[p],
            name=f"{node.spec.name}-mnist",
            classes=range(10),
            epsilon_cap=CAP,
        )
        for node, p in zip(federation.nodes, parts, strict=True)
    ]
    payload = {
        "name": "e2e",
        "model": "mlp",
        "dataset": datasets[0]["id"],
        "rounds": ROUNDS,
        "local_epochs": 1,
        "batch_size": 64,
        "lr": 0.5,
        "strategy": "fedavg",
        "dp": {"mode": "sgd", "target_epsilon": EPSILON, "delta": 1e-5, "max_grad_norm": 1.0},
        "committee_size": 1,
        "top_k": 2,
        "min_trainers": 2,
        "round_timeout_s": 300,
        "adaptive_work": True,
        "max_local_steps": MAX_LOCAL_STEPS,
        # The plain aggregation (FedNova over what the committee accepted, each share bounded by
        # max_share_bp), which test_adaptive_work recomputes: the robust default also clips and
        # masks by the round's other submissions (tests/jobs/robust_checks.py checks that one).
        "defense": "none",
    }
    job = federation.create_job(federation.nodes[0], payload)
    for node, dataset in zip(federation.nodes, datasets, strict=True):
        federation.join(node, job["id"], dataset["id"])
    # Every node prepares the first round once joined: in its agent, or (org-a) in its Celery worker.
    assert federation.wait_prepared(job["id"]), "a node did not prepare the job's first round"
    federation.start_job(federation.nodes[0], job["id"])
    final = federation.wait_for_job(job["id"], timeout_s=1200)
    return {"job": final, "datasets": datasets}


@pytest.fixture(scope="module")
def chain_events(federation, finished_job):
    w3 = Web3(HTTPProvider(federation.anvil.url))
    decoder = EventDecoder()
    logs = w3.eth.get_logs({"fromBlock": 0, "toBlock": "latest"})
    return [e for e in (decoder.decode(log) for log in logs) if e is not None]


def test_job_completes_all_rounds(finished_job):
    job = finished_job["job"]
    assert job["status"] == "finished", job
    assert job["current_round"] in (ROUNDS, ROUNDS + 1)


def _model_bytes(node, model_id: int) -> bytes:
    response = node.api().get(f"{node.url}/api/models/{model_id}/download", timeout=60)
    response.raise_for_status()
    return response.content


def _job_models(node, job_id: int) -> dict[int, dict]:
    response = node.api().get(f"{node.url}/api/models", params={"page_size": 100}, timeout=30)
    response.raise_for_status()
    body = response.json()
    items = body["results"] if isinstance(body, dict) else body
    return {m["round"]: m for m in items if int(m["job"]) == int(job_id)}


def test_every_node_holds_each_rounds_global_model_with_the_hash_on_chain(
    federation, finished_job, chain_events
):
    job_id = finished_job["job"]["id"]
    fixed = {
        e.args["round"]: _hex(e.args["modelHash"])
        for e in chain_events
        if e.name == "GlobalModelFixed" and int(e.args["jobId"]) == int(job_id)
    }
    assert len(fixed) == ROUNDS
    for node in federation.nodes:
        models = _job_models(node, job_id)
        assert set(models) == set(fixed), (node.spec.name, sorted(models))
        for number, model in models.items():
            assert _hex(content_hash(_model_bytes(node, model["id"]))) == fixed[number]
            assert _hex(model["onchain_hash"]) == fixed[number]


def test_final_model_is_far_above_chance_and_better_than_round_one(federation, finished_job, mnist):
    node = federation.nodes[1]
    models = _job_models(node, finished_job["job"]["id"])
    net = create_model("mlp", **mnist.model_kwargs())
    x, y = mnist.test.tensors()

    def accuracy(round_number: int) -> float:
        state, _ = decode_model(_model_bytes(node, models[round_number]["id"]))
        net.load_state_dict(
            {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in state.items()}
        )
        return evaluate(net, x, y)["accuracy"]

    first, last = accuracy(min(models)), accuracy(max(models))
    # Chance is 0.1. Where this job ends is noisy: under defense "none" a member scores the base
    # model plus one whole DP update on its ~90 noisy validation records, and from about 0.6 on an
    # honest update alone scores below the base (round 5 of one run: base 6328, updates 5489 and
    # 5998, none accepted), so the job levels off between about 0.55 and 0.65 and a bound of 0.6
    # failed once (0.579, round one 0.298). Four times chance and better than round one is what
    # learning means here; how far a defended job goes is bench/accuracy_at_epsilon.py's figure.
    assert last > 0.4, (first, last)
    assert last > first, (first, last)


def test_attacker_is_rejected_in_most_rounds(federation, finished_job):
    """The label flipper trains every round the draw does not seat it in (a committee of one is
    drawn uniformly each round, so it may sit in any), and most of its updates are rejected."""
    attacker = federation.nodes[3].address.lower()
    rounds = federation.rounds(federation.nodes[0], finished_job["job"]["id"])
    seated = [r["round"] for r in rounds if attacker in [a.lower() for a in r["committee"]]]
    attacked = [u for r in rounds for u in r["updates"] if u["trainer"].lower() == attacker]
    assert len(attacked) == ROUNDS - len(seated), (seated, attacked)
    assert attacked, f"the draw seated the attacker in every round: {seated}"
    rejected = [u for u in attacked if not u["accepted"]]
    assert len(rejected) >= len(attacked) - 1, attacked


def test_every_nodes_api_view_of_rounds_equals_the_chains_events(federation, finished_job, chain_events):
    job_id = int(finished_job["job"]["id"])
    finalized = {
        e.args["round"]: e.args
        for e in chain_events
        if e.name == "RoundFinalized" and int(e.args["jobId"]) == job_id
    }
    updates = {
        (e.args["round"], e.args["trainer"].lower()): e.args
        for e in chain_events
        if e.name == "UpdateSubmitted" and int(e.args["jobId"]) == job_id
    }
    for node in federation.nodes:
        rounds = federation.rounds(node, job_id)
        assert {r["round"] for r in rounds} == set(finalized), node.spec.name
        for r in rounds:
            event = finalized[r["round"]]
            accepted = {u["trainer"].lower() for u in r["updates"] if u["accepted"]}
            assert accepted == {a.lower() for a in event["accepted"]}
            assert [a.lower() for a in r["next_committee"]] == [a.lower() for a in event["nextCommittee"]]
            for u in r["updates"]:
                on_chain = updates[(r["round"], u["trainer"].lower())]
                assert _hex(u["content_hash"]) == _hex(on_chain["contentHash"])
                assert int(u["samples"]) == int(on_chain["samples"])


def test_privacy_spent_is_recorded_and_the_budget_refuses_a_job_that_would_exceed_it(
    federation, finished_job, chain_events
):
    spent_on_chain = {int(e.args["datasetId"]) for e in chain_events if e.name == "PrivacySpent"}
    trained = 0
    for node, dataset in zip(federation.nodes, finished_job["datasets"], strict=True):
        record = node.api().get(f"{node.url}/api/datasets/{dataset['id']}", timeout=30).json()
        budget = record["budget"]
        assert 0 <= budget["epsilon_spent"] <= EPSILON + 1e-6
        if budget["epsilon_spent"] > 0:
            trained += 1
            assert int(record["onchain_id"]) in spent_on_chain
    assert trained >= 3
    # A second job at epsilon 3 would take a dataset that already spent some of its cap of 3.5 past it.
    node = federation.nodes[1]
    dataset = finished_job["datasets"][1]
    payload = {
        "name": "too-much",
        "model": "mlp",
        "dataset": dataset["id"],
        "rounds": 5,
        "dp": {"mode": "sgd", "target_epsilon": EPSILON, "delta": 1e-5},
        "committee_size": 1,
        "top_k": 2,
        "min_trainers": 2,
        "round_timeout_s": 300,
    }
    # The proposer's own join is checked before anything goes on chain: the job is refused (409,
    # naming the field to change) rather than created and then unjoinable.
    response = node.api().post(f"{node.url}/api/jobs", json=payload, timeout=120)
    assert response.status_code == 409, response.text
    body = response.json()
    assert "dp.target_epsilon" in body["errors"], body
    assert f"cap {CAP:g}" in body["detail"] and "lower the target epsilon" in body["detail"], body


def _keys(federation, node) -> dict[str, str]:
    """Every sealed update's key ``node`` holds (its own and those it relayed): reference -> hex key."""
    query = "SELECT `key`, reference FROM jobs_updatekey"
    if node.spec.database == "mariadb":
        import MySQLdb

        url = urlparse(federation.mariadb_url)
        connection = MySQLdb.connect(
            host=url.hostname,
            port=url.port or 3306,
            user=url.username or "root",
            passwd=url.password or "",
            db=node.database_name,
        )
    else:
        connection = sqlite3.connect(f"file:{node.web.data_dir / 'db.sqlite3'}?mode=ro", uri=True, timeout=5)
    try:
        cursor = connection.cursor()
        cursor.execute(query)
        return {_hex(reference): key for key, reference in cursor.fetchall()}
    finally:
        connection.close()


def test_adaptive_work_is_charged_per_step_and_aggregated_by_fednova(federation, finished_job):
    """Each node ran its own steps per round (its releases in the rounds API: the first round at
    the nominal work, more once rounds ended early, never past the bound), each update claims in
    its hashed bytes exactly the steps its trainer was charged for, at the one noise planned for
    the bound, and every round's fixed model is fl_node's FedNova over the accepted blobs and their
    claimed steps, byte for byte."""
    job = finished_job["job"]
    job_id = int(job["id"])
    config = JobConfig.from_dict(job["config"])
    assert config.adaptive_work and config.max_local_steps == MAX_LOCAL_STEPS
    charged: dict[tuple[str, int], int] = {}
    noise: dict[str, set[float]] = {}  # each node's plan (its registered count sets its rate)
    for node in federation.nodes:
        for r in federation.rounds(node, job_id):
            runs = [p for p in r["privacy"] if p["kind"] == "dp_sgd" and p["status"] != "withheld"]
            assert len(runs) <= 1, (node.spec.name, r["round"], r["privacy"])
            if runs:
                charged[(node.address.lower(), r["round"])] = runs[0]["steps"]
                noise.setdefault(node.address, set()).add(runs[0]["noise_multiplier"])
    by_node: dict[str, list[int]] = {}
    for (trainer, _), steps in sorted(charged.items()):
        by_node.setdefault(trainer, []).append(steps)
    assert len(by_node) >= 3, charged
    assert all(1 <= steps <= MAX_LOCAL_STEPS for steps in charged.values()), charged
    assert all(steps[0] == NOMINAL_STEPS for steps in by_node.values()), by_node
    assert any(max(steps) > NOMINAL_STEPS for steps in by_node.values()), by_node
    # planned once, for the bound: more steps are charged, not noisier
    assert noise and all(len(multipliers) == 1 for multipliers in noise.values()), noise

    keys: dict[str, str] = {}
    for node in federation.nodes:
        keys.update(_keys(federation, node))
    global_state, _ = decode_model(encode_model(training.build_model(config).state_dict()))
    spec = update_spec(global_state)
    fedavg = get_strategy("fedavg")
    for r in sorted(federation.rounds(federation.nodes[1], job_id), key=lambda r: r["round"]):
        work = []
        accepted = [u for u in r["updates"] if u["accepted"]]
        # Bounded influence: each accepted update weighs its share of the claimed samples, capped at
        # max_share_bp (fl_node.aggregate.bounded_weights; two updates at 50% each get 1 / 2).
        weights = bounded_weights([int(u["samples"]) for u in accepted], config.max_share_bp)
        for update, weight in zip(accepted, weights, strict=True):
            blob = _blob_of(federation.nodes[1], update["reference"])
            blob = envelope.unseal(
                blob, bytes.fromhex(keys[_hex(update["reference"])]), update["content_hash"]
            )
            steps = adaptive_work.claimed_steps(blob, config)
            assert steps == charged[(update["trainer"].lower(), r["round"])], (r["round"], update["trainer"])
            work.append(WorkUpdate(decode_update(blob, spec), weight, steps, update["content_hash"]))
        fixed = _hex(r["global_model"]["hash"])
        if not work:  # nothing accepted: the model stays as it was
            assert fixed == _hex(content_hash(encode_model(global_state))), r["round"]
            continue
        new_state = normalized_average(
            global_state,
            work,
            max_steps=MAX_LOCAL_STEPS,
            momentum=config.momentum,
            tau_eff=work_norm(NOMINAL_STEPS, config.momentum),
            cap_steps=NOMINAL_STEPS,
        )
        recomputed = encode_model(new_state)
        assert _hex(content_hash(recomputed)) == fixed, r["round"]
        if min(w.steps for w in work) >= NOMINAL_STEPS:
            # Under the lr cap each of these trajectories is the nominal one's: FedNova's weights are
            # FedAvg's exactly (fl_node.normalized_average.nova_weights). Fewer steps than the nominal
            # (a slow member) weigh more: tests/jobs/test_adaptive_work.py.
            averaged, _ = fedavg.aggregate(
                global_state, [WeightedUpdate(w.update, w.num_samples, w.id) for w in work], None
            )
            assert _hex(content_hash(encode_model(averaged))) == fixed, r["round"]
        global_state, _ = decode_model(recomputed)


def _blob_of(node, reference: str) -> bytes:
    response = node.api().get(f"{node.url}/api/swarm/blobs/{reference}", timeout=120)
    response.raise_for_status()
    return response.content


def test_missing_login_is_refused(federation):
    node = federation.nodes[0]
    assert requests.get(f"{node.url}/api/jobs", timeout=10).status_code == 401


def test_every_member_shows_each_participants_own_epsilon_from_the_chain(
    federation, finished_job, chain_events
):
    """A participant's figure is its job's own epsilon at the job's delta, recomputed from public
    records alone: this test recomputes it from the chain's events (DatasetRegistered's size and
    hold-out, PrivacySpent's kinds and steps) and the job's config, and every member's API shows
    exactly that for every participant."""
    from fl_node.job.plan import participant_plan, scores_per_round
    from fl_node.privacy_plan import job_epsilon

    job = finished_job["job"]
    job_id = int(job["id"])
    config = JobConfig.from_dict(job["config"])
    registered = {int(e.args["datasetId"]): e.args for e in chain_events if e.name == "DatasetRegistered"}
    spends: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for e in chain_events:
        if e.name == "PrivacySpent" and int(e.args["jobId"]) == job_id:
            key = (int(e.args["datasetId"]), e.args["spender"].lower())
            spends.setdefault(key, []).append((int(e.args["kind"]), int(e.args["steps"])))
    shown = {}
    for node in federation.nodes:
        body = node.api().get(f"{node.url}/api/jobs/{job_id}", timeout=30).json()
        shown[node.spec.name] = {p["node"].lower(): p for p in body["privacy"]["participants"]}
    participants = job["participants"]
    for participant in participants:
        address, dataset_id = participant["node"].lower(), int(participant["dataset"])
        args = registered[dataset_id]
        holdout = str(args["publicHoldoutHash"]).removeprefix("0x").strip("0")
        plan = participant_plan(
            config,
            samples=int(args["samples"]),
            public_holdout=bool(holdout),
            scores_per_round=scores_per_round(len(participants), config.committee_size),
        )
        expected = job_epsilon(plan, spends.get((dataset_id, address), []))
        assert expected > 0, address
        for name, rows in shown.items():
            assert rows[address]["epsilon_spent"] == pytest.approx(expected, rel=1e-9), (name, address)
        own = next(node for node in federation.nodes if node.address.lower() == address)
        local = shown[own.spec.name][address]["epsilon_local"]
        # Adaptive work: an update's spend travels in its submitUpdate, which names no steps, so the
        # chain's figure counts the plan's most steps for it, where the node charged those it ran.
        assert expected >= local - 1e-9, (address, expected, local)
