"""Hostile events cannot stop an honest node's indexer (issue 13).

A hostile outsider (its own key, raw transactions) and a hostile member send what the contracts
accept; what the contracts refuse is fed to the indexer as crafted logs, and on anvil also
emitted in real blocks by the contracts' addresses (their code swapped for an emitter). The honest node's
indexer must mirror what it can (values without loss, strings replaced and cut), record and skip
what it cannot, reach the chain's head and keep mirroring later honest events: on the in-process
EVM and on anvil, on SQLite and on MariaDB (tests/adversarial/hostile_events_scenario.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devnet.anvil import AnvilProcess
from tests.adversarial.hostile_events_scenario import (
    BIG_ID,
    CAP_1E13,
    CRAFTED_JOB,
    U64_MAX,
    attack_chain,
    hostile_federation,
    index_under_attack,
)

ROOT = Path(__file__).resolve().parents[2]
REPLACEMENT = "\ufffd"


@pytest.fixture(scope="module")
def in_process_attack():
    """A consortium of 3 on a fresh in-process EVM, after the outsider's and the member's attacks."""
    ledgers = hostile_federation(None, "hostile-in-process")
    return ledgers, attack_chain(ledgers, "hostile-in-process")


@pytest.fixture
def in_process_report(db, in_process_attack):
    return index_under_attack(*in_process_attack)


def check_strings(report: dict) -> None:
    # NodeRegistry refuses the name (printable ASCII, 64 bytes at most): nothing emitted or mirrored
    assert report["raw_status"]["garbage_name"] == 0 and report["outsider_name"] is None
    # the same event crafted (as a contract that accepted it would emit it): replaced and cut
    name = report["crafted_name"]
    assert name.startswith(REPLACEMENT * 3 + "(\U0001f980" + REPLACEMENT) and name.endswith("N")
    assert len(name) == 200 and "\x00" not in name
    assert report["crafted_endpoint"] == "http://crafted.test"


def check_uint256(report: dict) -> None:
    assert BIG_ID in report["spend_job_ids"]
    assert report["dataset_1_spent"] == U64_MAX
    assert report["datasets"][str(BIG_ID)] == [U64_MAX, CAP_1E13]
    assert report["job"] == [CRAFTED_JOB, U64_MAX, 2**32 - 1]
    assert report["round"] == [U64_MAX, U64_MAX]
    assert report["update_samples"] == [[U64_MAX, "0x" + "05" * 64]] or report["update_samples"] == [
        (U64_MAX, "0x" + "05" * 64)
    ]
    # the contracts refuse the spend for a job that does not exist and the cap above epsilon 100
    assert report["raw_status"]["huge_job_spend"] == 0 and report["raw_status"]["huge_cap"] == 0


def check_rejections(report: dict) -> None:
    crafted = report["crafted"]
    assert crafted == {"events": 11, "new": 6, "rejected": 5}
    reasons = {(r["name"], r["reason"].split(" ")[0]) for r in report["rejected"]}
    assert ("ParticipantJoined", "unknown") in reasons
    assert ("UpdateSubmitted", "reference") in reasons
    assert ("EndpointUpdated", "endpoint") in reasons
    undecoded = [r for r in report["rejected"] if r["name"] == ""]
    # the bad data and the missing topic: no name, the reason only
    assert [r["reason"].startswith("cannot decode it") for r in undecoded] == [True, True]
    huge = next(r for r in report["rejected"] if r["name"] == "EndpointUpdated")
    assert huge["data_size"] > 1_000_000 and huge["data_chars"] <= 4096  # kept, bounded


def check_emitted(report: dict) -> None:
    """On anvil the refused events were also emitted by the contracts' addresses in real blocks."""
    if not report["emitted"]:
        return
    name = report["emitted_name"]
    assert name.startswith(REPLACEMENT * 3 + "(\U0001f980" + REPLACEMENT) and len(name) == 200
    assert BIG_ID + 1 in report["spend_job_ids"]
    assert report["first_sync_rejected"] == 1  # the ParticipantJoined of a job that does not exist
    assert [r["name"] for r in report["rejected"]].count("ParticipantJoined") == 2


def check_keeps_indexing(report: dict) -> None:
    assert report["cursor"] == report["head"]
    assert report["later_new"] >= 1
    assert report["honest_endpoint"] == report["moved_to"]


def check_all(report: dict) -> None:
    check_strings(report)
    check_emitted(report)
    check_uint256(report)
    check_rejections(report)
    check_keeps_indexing(report)


def test_outsider_name_not_utf8_and_10kb_is_replaced_and_cut(in_process_report):
    """Attack class: hostile outsider, malformed and oversized string in an event.

    An outsider sends registerNode from its own key by raw transaction with a name that is not
    UTF-8 and 10 KB long (and the same NodeApplied as a crafted log, where the contract refuses
    it): mirrored with U+FFFD replacements, cut to the column, never a stalled indexer."""
    check_strings(in_process_report)


def test_member_values_at_or_above_2_63_are_stored_without_loss(in_process_report):
    """Attack class: hostile member, integer overflow of the mirror's columns.

    spendPrivacy with a job id near 2^200 (by raw transaction; crafted where the contract
    refuses it), totals, sample counts and deadlines at 2^64 - 1, an epsilon cap of 1e13 and a
    dataset id near 2^200: the mirror holds them exactly, on a database whose integers stop at
    2^63 - 1."""
    check_uint256(in_process_report)


def test_unstorable_events_are_recorded_rejected_and_skipped(in_process_report):
    """Attack class: poison event in a batch (unknown job, 5 KB model reference, 1 MB endpoint,
    undecodable data, a missing topic).

    Each is recorded as rejected with its reason and at most 4 KB of its data; the valid events
    of the same batch, before and after them, are mirrored."""
    check_rejections(in_process_report)


def test_indexer_reaches_the_head_and_mirrors_later_honest_events(in_process_report):
    """Attack class: indexer halt (denial of service on every node that plans from the mirror).

    After all of the above the cursor is at the head and a later honest event is mirrored."""
    check_keeps_indexing(in_process_report)


@pytest.fixture(scope="module")
def anvil():
    with AnvilProcess() as process:
        yield process


@pytest.mark.integration
@pytest.mark.django_db
def test_anvil_and_sqlite(anvil):
    """Attack classes: all of the above, on a real JSON-RPC chain (anvil) and SQLite; there the
    refused events are also emitted by the contracts' own addresses in real blocks (an older
    contract that accepted them), through eth_getLogs and the real decoder."""
    ledgers = hostile_federation(anvil.url, "hostile-anvil-sqlite")
    report = index_under_attack(ledgers, attack_chain(ledgers, "hostile-anvil-sqlite"))
    assert report["emitted"]
    check_all(report)


def _run_on_mariadb(tmp_path, *options: str) -> dict:
    env = dict(os.environ, DEFL_DATA_DIR=str(tmp_path))
    command = [sys.executable, "-m", "tests.adversarial.hostile_events_scenario", *options]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["vendor"] == "mysql"
    return report


@pytest.mark.integration
def test_in_process_and_anvil_on_mariadb(anvil, tmp_path):
    """Attack classes: all of the above, on MariaDB (strict mode, utf8mb4), with the in-process
    EVM and with anvil: a fresh database, migrated, in a process of its own."""
    report = _run_on_mariadb(tmp_path, "--chain", "inprocess", "--chain", "anvil", "--anvil-url", anvil.url)
    assert report["anvil"]["emitted"] and not report["inprocess"]["emitted"]
    for chain in ("inprocess", "anvil"):
        check_all(report[chain])


@pytest.mark.integration
def test_a_mariadb_that_cannot_store_the_name_rejects_it_and_keeps_indexing(tmp_path):
    """Attack class: a string the database refuses (a 4-byte character in a name, on a MariaDB
    database created with the 3-byte "utf8"; MariaDB reports it as an OperationalError, which
    must not pass for a lost connection and stall the indexer): rejected with the server's
    reason, everything else as on any database."""
    report = _run_on_mariadb(tmp_path, "--chain", "inprocess", "--charset", "utf8")["inprocess"]
    assert report["crafted_name"] is None
    applied = [r for r in report["rejected"] if r["name"] == "NodeApplied"]
    assert len(applied) == 1 and "Incorrect string value" in applied[0]["reason"]
    assert "ledger_node" not in applied[0]["reason"]  # no database or table names in the API
    assert report["crafted"] == {"events": 11, "new": 5, "rejected": 6}
    check_uint256(report)
    check_keeps_indexing(report)
