"""A node destroyed mid-job and restored from a backup taken before the job started (real processes).

Four organizations (anvil, four SQLite nodes) join a job; every node is backed up with
`manage.py node backup` while it runs, before the job starts. Once a node has begun round 1's
training (its task running or done), it is SIGKILLed, its whole data directory deleted, and it is
restored with `manage.py node restore` from that backup (its database, chunk index and contracts file; no
chunks: the restore fetches the missing ones back from the peers). Brought back, it catches up
from the chain and trains later rounds, and the job finishes:

- no transaction is sent twice (each node's once-per-round calls counted on chain, as
  bench/faults.py does), and every round has its model fixed;
- no release is charged twice: at most one training release per round in the restored node's
  records, and every update of it on chain has its release recorded there as released;
- the chunks its index listed are back (fetched from peers), and its dataset is readable: it trains.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
from faultnet import (
    REAL_PROCESS_FAULT_MARKS,
    duplicates,
    events,
    kill_node,
    restart_node,
    sent_transactions,
    wait_until,
)
from phases import training_began
from scenarios import KILL_ROUNDS, digits_parts, job_payload

from devnet.localnet import LocalFederation, NodeSpec

pytestmark = REAL_PROCESS_FAULT_MARKS


def _prepared_job(federation: LocalFederation) -> int:
    parts = digits_parts(len(federation.nodes))
    datasets = [
        federation.upload_dataset(
            node, x, y, name=f"{node.spec.name}-digits", classes=range(10), epsilon_cap=10.0
        )
        for node, (x, y) in zip(federation.nodes, parts, strict=True)
    ]
    job = federation.create_job(federation.nodes[0], job_payload(datasets[0]["id"], rounds=KILL_ROUNDS))
    for node, dataset in zip(federation.nodes, datasets, strict=True):
        federation.join(node, job["id"], dataset["id"])
    assert federation.wait_prepared(job["id"], timeout_s=900), "a node did not prepare round 1"
    return job["id"]


@pytest.fixture(scope="module")
def restored(tmp_path_factory):
    root = tmp_path_factory.mktemp("restore")
    specs = [NodeSpec(f"org-{c}") for c in "abcd"]
    with LocalFederation(root / "federation", specs, log=lambda _line: None) as federation:
        job_id = _prepared_job(federation)
        backups, backup_s = {}, {}
        for node in federation.nodes:  # while every node runs
            backups[node.address] = root / f"backup-{node.spec.name}"
            clock = time.monotonic()
            node.web.manage("node", "backup", str(backups[node.address]))
            backup_s[node.address] = time.monotonic() - clock
        federation.start_job(federation.nodes[0], job_id)
        victim = wait_until(
            lambda: next(
                (n for n in reversed(federation.nodes) if training_began(federation, n, job_id, 1)), None
            ),
            300,
            "a node that began training round 1",
            every_s=0.02,
        )
        kill_node(victim)
        logs = root / "victim-logs"
        logs.mkdir()
        for log in victim.web.data_dir.glob("*.log"):
            shutil.copyfile(log, logs / log.name)
        shutil.rmtree(victim.web.data_dir)  # the disk is gone
        victim.web.data_dir.mkdir()
        clock = time.monotonic()
        restore = victim.web.manage("node", "restore", str(backups[victim.address]), timeout=900)
        restore_s = time.monotonic() - clock
        restart_node(victim)
        job = federation.wait_for_job(job_id, timeout_s=1800)
        figures = {"backup_s": backup_s, "restore_s": restore_s, "restore": restore.stdout.strip()}
        (root / "figures.json").write_text(json.dumps(figures, indent=2))  # for docs/BENCHMARKS-style notes
        yield {
            "job_id": job_id,
            "job": job,
            "victim": victim.address.lower(),
            "restore_output": restore.stdout,
            "restore_s": restore_s,
            "backup_s": backup_s[victim.address],
            "backup_bytes": sum(p.stat().st_size for p in backups[victim.address].rglob("*") if p.is_file()),
            "events": events(federation, job_id),
            "calls": sent_transactions(federation),
            "victim_rounds": federation.rounds(victim, job_id),
        }


def test_the_job_finishes_with_every_model_fixed_or_skipped_for_the_victim(restored):
    """Every finalized round's model is fixed, except where the draw (uniform over the participants,
    the victim included) gave the one aggregating seat to the victim while it was down: that round's
    aggregation is skipped at its deadline."""
    assert restored["job"]["status"] == "finished", restored["job"]
    events = restored["events"]
    fixed = {e.args["round"] for e in events if e.name == "GlobalModelFixed"}
    skipped = {e.args["round"] for e in events if e.name == "AggregationSkipped"}
    finalized = {e.args["round"]: e.args for e in events if e.name == "RoundFinalized"}
    assert fixed and not fixed & skipped and fixed | skipped == set(finalized), (fixed, skipped)
    assert set(finalized) <= set(range(1, KILL_ROUNDS + 1)), sorted(finalized)
    for number in skipped:
        assert [a.lower() for a in finalized[number]["nextCommittee"]] == [restored["victim"]], number


def test_no_transaction_is_sent_twice(restored):
    assert duplicates(restored["calls"]) == {}


def test_the_restored_node_charges_each_release_once_and_loses_none_it_published(restored):
    victim = restored["victim"]
    published = {
        e.args["round"]
        for e in restored["events"]
        if e.name == "UpdateSubmitted" and e.args["trainer"].lower() == victim
    }
    assert published, "the restored node never trained again (its dataset or chunks were not back)"
    for round_ in restored["victim_rounds"]:
        training = [r for r in round_["privacy"] if r["kind"] in ("dp_sgd", "update_gaussian")]
        assert len([r for r in training if r["status"] == "released"]) <= 1, round_
        if round_["round"] in published:
            assert [r["status"] for r in training].count("released") == 1, round_


def test_the_missing_chunks_came_back_from_the_peers(restored):
    output = restored["restore_output"]
    assert "restored from" in output, output
    missing = int(output.split("chunks missing here ")[1].split(",")[0])
    fetched = int(output.split("fetched from peers ")[1].split(",")[0])
    left = int(output.split("left to the peers' repairs ")[1].split()[0])
    assert missing > 0 and fetched == missing and left == 0, output
