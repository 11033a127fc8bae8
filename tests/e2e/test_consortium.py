"""A job on the consortium chain: one Clique validator per organization, one killed mid-job (issue 38).

Three organizations, each node's processes talking to their own organization's validator (the
EthereumJS client) and nothing else, run a two-round DP job. While round 1 trains, org-c's
validator is killed (SIGKILL, its data kept): the other two go on sealing, and it is started
again on its data a few blocks later. The job must finish; the restarted validator must catch
up and follow the one head; and every validator's own chain must hold each round's fixed model,
the one the nodes report.
"""

from __future__ import annotations

import time

import pytest
from eth_account import Account

from backend.ledger.abi import EventDecoder
from backend.ledger.chains import connect
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger, load_deployment
from backend.ledger.resources import JobStatus
from devnet import clique
from devnet.localnet import LocalFederation, NodeSpec
from fl_node.data import load_dataset
from fl_node.partition import partition

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ROUNDS = 2
OUTAGE_BLOCKS = 4  # blocks the two live validators seal while the third is down


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    specs = [NodeSpec("org-a"), NodeSpec("org-b"), NodeSpec("org-c")]
    root = tmp_path_factory.mktemp("consortium")
    with LocalFederation(root, specs, chain="consortium", block_time=2) as federation:
        yield federation


def _wait(condition, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def _head(validator) -> int:
    try:
        return validator.head()
    except OSError:  # a loaded validator may drop a request
        return -1


@pytest.fixture(scope="module")
def run(federation):
    mnist = load_dataset("mnist", seed=0)
    parts = partition(mnist.train.y, len(federation.nodes), "iid", seed=0)
    datasets = [
        federation.upload_dataset(
            node,
            mnist.train.x[p],
            mnist.train.y[p],
            name=f"{node.spec.name}-mnist",
            classes=range(10),
            epsilon_cap=10.0,
        )["id"]
        for node, p in zip(federation.nodes, parts, strict=True)
    ]
    payload = {
        "name": "consortium",
        "model": "mlp",
        "dataset": datasets[0],
        "rounds": ROUNDS,
        "local_epochs": 1,
        "batch_size": 64,
        "lr": 0.5,
        "strategy": "fedavg",
        "dp": {"mode": "sgd", "target_epsilon": 3.0, "delta": 1e-5, "max_grad_norm": 1.0},
        "committee_size": 1,
        "top_k": 2,
        "min_trainers": 2,
        "round_timeout_s": 300,
    }
    job = federation.create_job(federation.nodes[0], payload)
    for node, dataset in zip(federation.nodes, datasets, strict=True):
        federation.join(node, job["id"], dataset)
    federation.wait_prepared(job["id"])
    federation.start_job(federation.nodes[0], job["id"])

    assert federation.clique is not None
    live, victim = federation.clique.validators[:2], federation.clique.validators[2]
    _wait(
        lambda: federation.job(federation.nodes[0], job["id"])["status"] == "running", "job not running", 600
    )
    victim.kill()
    down_at = max(_head(v) for v in live)
    _wait(
        lambda: min(_head(v) for v in live) >= down_at + OUTAGE_BLOCKS,
        "the chain stopped with one validator of three down",
        180,
    )
    outage = {"down_at": down_at, "sealed_while_down": min(_head(v) for v in live) - down_at}
    federation.clique.restart(victim)
    final = federation.wait_for_job(job["id"], timeout_s=1800)
    height = federation.clique.wait_one_head(timeout_s=300)
    return {"job": final, "outage": outage, "height": height}


def test_the_job_finishes_with_a_validator_killed_and_restarted_mid_job(run):
    assert run["job"]["status"] == "finished"
    assert run["outage"]["sealed_while_down"] >= OUTAGE_BLOCKS  # the chain went on without it


def test_the_restarted_validator_caught_up_with_the_same_chain(federation, run):
    assert federation.clique is not None
    validators = federation.clique.validators
    height = run["height"]
    assert height > run["outage"]["down_at"] + OUTAGE_BLOCKS
    assert len({v.block_hash(height) for v in validators}) == 1


def test_every_validators_chain_holds_each_rounds_fixed_model(federation, run):
    assert federation.clique is not None
    deployment = load_deployment(federation.root / "contracts.json")
    assert deployment is not None and deployment.evm_version == "london"
    job = run["job"]
    rounds = federation.rounds(federation.nodes[0], job["id"])
    reported = {r["round"]: r["global_model"]["hash"].lower() for r in rounds if r.get("global_model")}
    assert sorted(reported) == list(range(1, ROUNDS + 1))
    decoder = EventDecoder()
    reader = Account.create()  # reads only
    for validator in federation.clique.validators:
        ledger = Ledger(ChainClient(connect(validator.url), reader), deployment)
        state = ledger.fl.get_job(job["onchain_id"])
        assert state.status is JobStatus.FINISHED, validator.url
        assert "0x" + state.model_hash.hex() == reported[ROUNDS], validator.url
        logs = ledger.client.get_logs(list(deployment.addresses.values()), deployment.block, run["height"])
        fixed = {
            e.args["round"]: e.args["modelHash"].lower()
            for e in (decoder.decode(log) for log in logs)
            if e is not None and e.name == "GlobalModelFixed" and e.args["jobId"] == job["onchain_id"]
        }
        assert fixed == reported, validator.url


def test_each_node_reads_its_own_organizations_validator(federation):
    assert federation.clique is not None
    urls = federation.chain_urls
    assert urls == [v.url for v in federation.clique.validators] and len(set(urls)) == len(urls)
    assert {int(v.rpc("eth_chainId"), 16) for v in federation.clique.validators} == {clique.CHAIN_ID}
