"""Hostile events against an honest node's indexer, on any chain and any database.

Used by test_hostile_events.py in the test process (SQLite), and run as

    python -m tests.adversarial.hostile_events_scenario --chain inprocess --chain anvil --anvil-url URL

against a fresh MariaDB database (it creates, migrates and drops it; the last line printed is a
JSON object: chain -> summary), so the same attacks meet both databases.

The chain part (``attack_chain``) sends what the contracts accept from a hostile outsider and a
hostile member, as raw transactions signed with their own keys; ``crafted_logs`` are the events
of values the contracts refuse (fed to the indexer as a contract that accepted them would emit
them); ``index_under_attack`` runs the honest node's indexer through all of it and reports.
"""

from __future__ import annotations

import argparse
import json
import secrets
from dataclasses import dataclass
from typing import Any

from tests.mariadb_scenario import throwaway_database

BIG_ID = 2**200  # a job id near 2^200 (spendPrivacy)
U64_MAX = 2**64 - 1  # deadlines, sample counts, totals at or above 2^63
CAP_1E13 = 10**13 * 10**6  # an epsilon cap of 1e13, in micro-epsilon (> 2^63)
# not UTF-8, a NUL (some databases refuse it), a 4-byte character (MariaDB's 3-byte "utf8" would
# refuse it), and 10 KB long
BAD_NAME = b"\xff\xfe\xc3(" + "\U0001f980".encode() + b"\x00" + b"N" * 10_000
CRAFTED_JOB = 2**63 + 7


@dataclass
class ChainAttack:
    outsider: str  # the outsider who sent registerNode with BAD_NAME
    garbage_name_status: int  # 0: the contract refused it (nothing emitted), 1: accepted
    huge_job_spend_status: int
    huge_cap_status: int
    crafted_outsider: str  # the node a crafted NodeApplied names
    emitted_outsider: str | None = None  # on anvil: the node of a NodeApplied its contract emitted


def hostile_federation(chain_url: str | None, seed: str, members: int = 3):
    """A bootstrapped consortium of ``members`` on a fresh in-process chain or at ``chain_url``."""
    from web3 import HTTPProvider, Web3

    from backend.ledger.chains import ensure_funds
    from backend.ledger.client import ChainClient
    from backend.ledger.deployment import Ledger, deploy_contracts
    from devnet.consortium import bootstrap_consortium, dev_account
    from tests.ledger.conftest import make_federation

    if chain_url is None:
        return make_federation(members, seed)
    w3 = Web3(HTTPProvider(chain_url))
    accounts = [dev_account(i, seed) for i in range(members)]
    for account in accounts:
        ensure_funds(w3, account.address)
    clients = [ChainClient(w3, account) for account in accounts]
    deployment = deploy_contracts(clients[0])
    ledgers = [Ledger(client, deployment) for client in clients]
    bootstrap_consortium(ledgers, [f"http://n{i}.test" for i in range(members)])
    return ledgers


def attack_chain(ledgers, seed: str) -> ChainAttack:
    """What a hostile outsider and a hostile member (ledgers[1]) send, as raw transactions."""
    from backend.ledger.chains import ensure_funds
    from devnet.consortium import dev_account, overlay_of, public_key
    from tests.adversarial.hostile_chain import encode_raw, send_raw

    w3, deployment = ledgers[0].client.w3, ledgers[0].deployment
    # an honest dataset (id 1) that the crafted PrivacySpent below refers to
    ledgers[0].data.register_dataset(secrets.token_bytes(32), b"\x02" * 32, b"\x03" * 32, 100, 5_000_000)

    outsider = dev_account(0, f"{seed}-outsider")
    ensure_funds(w3, outsider.address)
    call = encode_raw(
        "NodeRegistry",
        "registerNode",
        name=BAD_NAME,
        endpoint=b"http://outsider.test",
        pubkey=public_key(outsider),
        overlay=overlay_of(outsider.address),
    )
    garbage = send_raw(w3, outsider, deployment.address("NodeRegistry"), call)

    hostile = ledgers[1].client.account  # a member: spends for a job id near 2^200
    call = encode_raw("FederatedLearning", "spendPrivacy", jobId=BIG_ID, round=1, amount=1)
    spend = send_raw(w3, hostile, deployment.address("FederatedLearning"), call)

    call = encode_raw(
        "DataRegistry",
        "registerDataset",
        commitment=secrets.token_bytes(32),
        swarmRef=b"\x06" * 32,
        schemaHash=b"\x07" * 32,
        samples=U64_MAX,
        privacyCap=CAP_1E13,
        initialSpend=0,
    )
    cap = send_raw(w3, hostile, deployment.address("DataRegistry"), call)
    emitted = _emit_refused_events(ledgers, seed) if "anvil" in w3.client_version.lower() else None
    return ChainAttack(
        emitted_outsider=emitted,
        outsider=outsider.address,
        garbage_name_status=int(garbage["status"]),
        huge_job_spend_status=int(spend["status"]),
        huge_cap_status=int(cap["status"]),
        crafted_outsider=dev_account(1, f"{seed}-outsider").address,
    )


def _emit_refused_events(ledgers, seed: str) -> str:
    """On anvil, the events today's contracts refuse, emitted by the contracts' own addresses in
    real blocks (see hostile_chain.emit_as): they reach the indexer through the RPC's eth_getLogs
    and the real decoder, as from an older contract that accepted them."""
    from backend.ledger.chains import ensure_funds
    from devnet.consortium import dev_account, overlay_of
    from tests.adversarial.hostile_chain import craft_log, emit_as, event_args

    w3, deployment = ledgers[0].client.w3, ledgers[0].deployment
    node = dev_account(2, f"{seed}-outsider")
    ensure_funds(w3, node.address)
    member = ledgers[1].client.address

    def log(contract: str, event: str, **args: Any) -> dict[str, Any]:
        return craft_log(deployment, contract, event, event_args(contract, event, **args), block=0)

    applied = dict(name=BAD_NAME, endpoint="http://emitted.test", pubkey=b"\x09" * 64)
    emit_as(
        w3,
        node,
        log("NodeRegistry", "NodeApplied", node=node.address, overlay=overlay_of(node.address), **applied),
    )
    spent = dict(datasetId=1, jobId=BIG_ID + 1, spender=member, jobTotal=U64_MAX, sourceTotal=U64_MAX)
    emit_as(w3, node, log("DataRegistry", "PrivacySpent", **spent))
    emit_as(w3, node, log("FederatedLearning", "ParticipantJoined", jobId=BIG_ID, node=member, datasetId=1))
    return node.address


def crafted_logs(deployment, attack: ChainAttack, block: int, member: str) -> list[dict[str, Any]]:
    """Events of values the contracts refuse today, in one batch with a valid one in between."""
    from devnet.consortium import overlay_of
    from tests.adversarial.hostile_chain import craft_log, event_args

    def log(contract: str, event: str, position: int, **args: Any) -> dict[str, Any]:
        return craft_log(
            deployment, contract, event, event_args(contract, event, **args), block=block, log_index=position
        )

    spec_abi = next(
        i for i in _event_abi("FederatedLearning", "JobProposed")["inputs"] if i["name"] == "spec"
    )
    spec_names = [c["name"] for c in spec_abi["components"]]
    spec = dict(zip(spec_names, event_args("FederatedLearning", "JobProposed")["spec"], strict=True))
    spec.update(
        configHash=b"\x01" * 32,
        initialModelRef=b"\x02" * 64,
        initialModelHash=b"\x03" * 32,
        useBlocks=False,
        rounds=3,
        committeeSize=1,
        topK=1,
        minTrainers=1,
        joinDeadline=U64_MAX,
        trainPeriod=2**32 - 1,
        scorePeriod=2**32 - 1,
    )
    spec_tuple = tuple(spec[name] for name in spec_names)
    node = attack.crafted_outsider
    undecodable = log("NodeRegistry", "EndpointUpdated", 9, node=node, endpoint="x")
    undecodable["data"] = b"\x00\x01"  # a known event with data that is not its ABI encoding
    topicless = log("NodeRegistry", "NodeLeft", 10, node=node, memberCount=1)
    topicless["topics"] = topicless["topics"][:1]  # its indexed node missing
    return [
        # a name that is not UTF-8 and 10 KB long: mirrored, replaced and cut to the column
        log(
            "NodeRegistry",
            "NodeApplied",
            0,
            node=node,
            name=BAD_NAME,
            endpoint="http://crafted.test",
            pubkey=b"\x09" * 64,
            overlay=overlay_of(node),
        ),
        # a spend for a job id near 2^200, totals at 2^64 - 1: mirrored without loss
        log(
            "DataRegistry",
            "PrivacySpent",
            1,
            datasetId=1,
            jobId=BIG_ID,
            spender=member,
            amount=U64_MAX,
            jobTotal=U64_MAX,
            sourceTotal=U64_MAX,
        ),
        # an epsilon cap of 1e13, 2^64 - 1 samples and spend under a dataset id near 2^200
        log(
            "DataRegistry",
            "DatasetRegistered",
            2,
            datasetId=BIG_ID,
            owner=member,
            commitment=b"\x0a" * 32,
            swarmRef=b"\x0b" * 32,
            schemaHash=b"\x0c" * 32,
            samples=U64_MAX,
            privacyCap=CAP_1E13,
            sourceId=BIG_ID,
            initialSpend=U64_MAX,
        ),
        # a job id above 2^63 whose deadlines are at 2^64 - 1
        log("FederatedLearning", "JobProposed", 3, jobId=CRAFTED_JOB, proposer=member, spec=spec_tuple),
        log(
            "FederatedLearning",
            "RoundOpened",
            4,
            jobId=CRAFTED_JOB,
            round=1,
            committee=[member],
            modelHash=b"\x03" * 32,
            updateDeadline=U64_MAX,
            scoreDeadline=U64_MAX,
        ),
        # rejected: a job that does not exist
        log("FederatedLearning", "ParticipantJoined", 5, jobId=2**255, node=member, datasetId=1, index=0),
        # rejected: a model reference of 5 KB (a reference column holds 64 bytes)
        log(
            "FederatedLearning",
            "UpdateSubmitted",
            6,
            jobId=CRAFTED_JOB,
            round=1,
            trainer=member,
            index=0,
            modelRef=b"\x01" * 5_000,
            contentHash=b"\x02" * 32,
            samples=U64_MAX,
        ),
        # rejected: an endpoint of 1 MB (kept as the first 4 KB of its data)
        log("NodeRegistry", "EndpointUpdated", 7, node=node, endpoint=b"http://" + b"e" * 1_000_000),
        # valid, between the bad ones: still mirrored
        log(
            "FederatedLearning",
            "UpdateSubmitted",
            8,
            jobId=CRAFTED_JOB,
            round=1,
            trainer=member,
            index=0,
            modelRef=b"\x05" * 64,
            contentHash=b"\x06" * 32,
            samples=U64_MAX,
        ),
        undecodable,  # rejected when decoded
        topicless,  # rejected when decoded
    ]


def _event_abi(contract: str, event: str) -> dict[str, Any]:
    from backend.ledger.artifacts import load_artifact

    return next(i for i in load_artifact(contract).abi if i["type"] == "event" and i["name"] == event)


def index_under_attack(ledgers, attack: ChainAttack) -> dict[str, Any]:
    """The honest node (ledgers[0]) indexes everything, then later honest events; the report."""
    from backend.ledger import models
    from backend.ledger.indexer import EventIndexer

    honest, member = ledgers[0], ledgers[1].client.address
    # The crafted logs stand for events a contract that accepted their values would have emitted:
    # they are not in the real chain, and an indexer that follows the canonical chain (reorgs.py)
    # would rightly unwind them on its next pass. What is tested here is what the mirror makes of
    # such values, so this indexer takes the chain's word for its past blocks (as on the
    # in-process EVM, which never reorganises).
    indexer = EventIndexer(honest.client, honest.deployment, reorg_window=0)
    first = indexer.sync()
    block = indexer.last_block()
    crafted = indexer.store_logs(crafted_logs(honest.deployment, attack, block, member), block)
    moved = f"http://moved-{secrets.token_hex(4)}.test"
    honest.nodes.update_endpoint(moved)  # a later honest event
    later = indexer.sync()
    addresses = set(honest.deployment.addresses.values())
    node = lambda address: models.Node.objects.filter(address=address).first()  # noqa: E731
    outsider, crafted_node = node(attack.outsider), node(attack.crafted_outsider)
    emitted = node(attack.emitted_outsider) if attack.emitted_outsider else None
    job = models.Job.objects.filter(job_id=CRAFTED_JOB).first()
    round_ = models.Round.objects.filter(job=job, number=1).first() if job else None
    return {
        "head": honest.client.block_number(),
        "cursor": indexer.last_block(),
        "first_sync_rejected": first.rejected,
        "crafted": {"events": crafted.events, "new": crafted.new_events, "rejected": crafted.rejected},
        "later_new": later.new_events,
        "raw_status": {
            "garbage_name": attack.garbage_name_status,
            "huge_job_spend": attack.huge_job_spend_status,
            "huge_cap": attack.huge_cap_status,
        },
        "outsider_name": outsider.name if outsider else None,
        "crafted_name": crafted_node.name if crafted_node else None,
        "crafted_endpoint": crafted_node.endpoint if crafted_node else None,
        "emitted": attack.emitted_outsider is not None,
        "emitted_name": emitted.name if emitted else None,
        "honest_endpoint": node(honest.client.address).endpoint,
        "moved_to": moved,
        "spend_job_ids": sorted(models.PrivacySpend.objects.values_list("job_id", flat=True)),
        "dataset_1_spent": models.Dataset.objects.get(dataset_id=1).privacy_spent,
        "datasets": {
            str(d.dataset_id): [d.samples, d.privacy_cap]
            for d in models.Dataset.objects.order_by("dataset_id")
        },
        "job": [job.job_id, job.join_deadline, job.train_period] if job else None,
        "round": [round_.update_deadline, round_.score_deadline] if round_ else None,
        "update_samples": list(models.Update.objects.filter(job=job).values_list("samples", "reference")),
        "rejected": [
            {"name": r.name, "reason": r.reason, "data_chars": len(r.data), "data_size": r.data_size}
            for r in models.RejectedEvent.objects.filter(address__in=addresses).order_by(
                "block_number", "log_index"
            )
        ],
    }


def reset_mirror() -> None:
    """Empty the ledger's tables (between two deployments sharing one database)."""
    from django.apps import apps
    from django.db.models import ProtectedError

    # A protected row (a dataset's budget source) goes once the rows that refer to it are gone.
    left = list(apps.get_app_config("ledger").get_models())
    while left:
        protected = []
        for model in left:
            try:
                model._default_manager.all().delete()
            except ProtectedError:
                protected.append(model)
        if len(protected) == len(left):
            raise RuntimeError(f"cannot empty {[m.__name__ for m in protected]}: they protect each other")
        left = protected


# ----------------------------------------------------------------------------- MariaDB runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chain", action="append", choices=["inprocess", "anvil"], required=True)
    parser.add_argument("--anvil-url", default=None)
    parser.add_argument("--mariadb", default="mysql://root@127.0.0.1:3306", help="server URL, no database")
    parser.add_argument("--charset", default="utf8mb4", help="of the database (utf8: 3-byte characters only)")
    options = parser.parse_args()
    with throwaway_database("defl_hostile", options.mariadb, charset=options.charset) as database:
        report = {}
        for chain in options.chain:
            reset_mirror()
            seed = f"hostile-{chain}-{database}"
            ledgers = hostile_federation(options.anvil_url if chain == "anvil" else None, seed)
            report[chain] = index_under_attack(ledgers, attack_chain(ledgers, seed))
        from django.db import connection

        report["vendor"] = connection.vendor
    print(json.dumps(report))


if __name__ == "__main__":
    main()
