"""One in-process chain (eth-tester) per session with a consortium of 12 members, each with a dataset.

Every test runs on a snapshot of that state and is reverted afterwards, so tests stay independent
and fast (no redeploy).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from backend.ledger.chains import ensure_funds, new_in_process_chain
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger, deploy_contracts
from backend.ledger.resources import JobSpec
from devnet.consortium import bootstrap_consortium, dev_account

MEMBERS = 12
OUTSIDERS = 2
REF = b"\x11" * 32
HASH = b"\x22" * 32


@dataclass
class Federation:
    w3: object
    ledgers: list[Ledger]  # members first, then outsiders
    rule: object

    @property
    def tester(self):
        return self.w3.provider.ethereum_tester

    def member(self, i: int) -> Ledger:
        return self.ledgers[i]

    def outsider(self, i: int = 0) -> Ledger:
        return self.ledgers[MEMBERS + i]

    def address(self, i: int) -> str:
        return self.ledgers[i].client.address

    def now(self) -> int:
        return self.w3.eth.get_block("latest")["timestamp"]

    def advance(self, seconds: int) -> None:
        self.tester.time_travel(self.now() + seconds)
        self.tester.mine_blocks(1)

    def spec(self, **overrides) -> JobSpec:
        values = dict(
            config_hash=b"\x01" * 32,
            initial_model_ref=REF,
            initial_model_hash=HASH,
            rounds=2,
            committee_size=3,
            top_k=3,
            min_trainers=2,
            join_deadline=self.now() + 3600,
            train_period=600,
            score_period=600,
        )
        values.update(overrides)
        return JobSpec(**values)

    def score(self, job: int, round_: int, given: dict, base: dict | None = None) -> list:
        """Commit-reveal: every member in ``given`` ({member index: {trainer address: score}})
        commits, then each reveals in order; the reveal receipts (the last may finalize)."""
        base = base or {}
        for m, scores in given.items():
            self.member(m).fl.commit_scores(job, round_, scores, base.get(m, 0), salt(m))
        return [
            self.member(m).fl.reveal_scores(job, round_, scores, base.get(m, 0), salt(m))
            for m, scores in given.items()
        ]

    def index(self, address: str) -> int:
        return next(i for i, ledger in enumerate(self.ledgers) if ledger.client.address == address)

    def join(self, job: int, member: int, dataset: int | None = None):
        """Member ``member`` joins with its own dataset (or ``dataset``), committing to its draw secret."""
        return self.member(member).fl.join(
            job, member + 1 if dataset is None else dataset, draw_secret(member, job)
        )

    def reveal_all(self, job: int, members) -> list:
        """Each member reveals its draw secret; the last reveal draws the first committee."""
        return [self.member(m).fl.reveal_draw_secret(job, draw_secret(m, job)) for m in members]

    def running_job(self, participants: int = 8, **overrides) -> tuple[int, list[int], list[int]]:
        """Propose (by member 0), join members 0..participants-1 with their datasets, start, and
        reveal every draw secret (the last reveal draws the committee). Returns (job id, committee
        indexes in seat order, trainer indexes ascending)."""
        spec = self.spec(**overrides)
        job = self.member(0).fl.propose_job(spec)
        for i in range(participants):
            self.join(job, i)
        self.member(0).fl.start_job(job)
        self.reveal_all(job, range(participants))
        committee = [self.index(a) for a in self.member(0).fl.committee(job)]
        return job, committee, sorted(set(range(participants)) - set(committee))


def salt(member: int) -> bytes:
    """A member's commitment salt in tests (a node draws a secret one)."""
    return bytes([member + 1]) * 32


def draw_secret(member: int, job: int) -> bytes:
    """A member's draw secret for a job in tests (a node derives a secret one)."""
    return bytes([member + 1, job % 256]) * 16


@pytest.fixture(scope="session")
def federation_base():
    w3 = new_in_process_chain()
    accounts = [dev_account(i, "contracts-tests") for i in range(MEMBERS + OUTSIDERS)]
    for account in accounts:
        ensure_funds(w3, account.address)
    clients = [ChainClient(w3, account) for account in accounts]
    # a test deployment: committees of 2 are allowed here (test_committee_size.py deploys one without)
    deployment = deploy_contracts(clients[0], with_harness=True, allow_small_committees=True)
    ledgers = [Ledger(client, deployment) for client in clients]
    bootstrap_consortium(ledgers[:MEMBERS], [f"http://node{i}.test" for i in range(MEMBERS)])
    for i in range(MEMBERS):
        ledgers[i].data.register_dataset(
            bytes([i + 1]) * 32, bytes([i + 2]) * 32, b"\x05" * 32, 100 + i, 3_000_000
        )
    return Federation(w3, ledgers, ledgers[0].rule)


@pytest.fixture
def fed(federation_base):
    tester = federation_base.tester
    snapshot = tester.take_snapshot()
    yield federation_base
    tester.revert_to_snapshot(snapshot)
    for ledger in federation_base.ledgers:
        ledger.client.nonces.reset()
