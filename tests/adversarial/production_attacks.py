"""A hostile minority on a production deployment (issue 32), scripted: what its keys can do alone.

Used by test_hostile_production.py. Three hostile keys (``HostileMember``: their own keys, raw
transactions, signed peer requests, one key server as their registered endpoint) act in two jobs
of three honest nodes on anvil, with committees of 3 (no development flag):

The draws job (``Coalition``): the three keys collude. Mallory proposes the job and grinds its
start: with the honest nodes cut off from the chain (their RPC endpoint dark), it starts the job
in block after block (anvil snapshots: each attempt mined on its own, then undone), every
participant revealing the secret it committed to at join (the honest nodes' are HMACs of their
keys, recomputed here as they do), and reads the committee each attempt draws; then it withholds
a colluder's secret. Once the job runs, every seated colluder scores its accomplices' updates
10000 and everyone else's 0; an unseated colluder trains junk. In round 1 the last colluder to
reveal finalizes the round, and with the honest nodes cut off again Mallory grinds
``skipAggregation`` past the aggregation deadline in block after block, then undoes it. A
colluder the draw seats to aggregate votes the model the honest members compute (so no round is
skipped on its account).

The weights job (``Intruders``): Mallory and Trudy registered datasets of 10^12 samples, Victor
joins with an honest provider's dataset it was granted. A key the draw seats rubber-stamps: every
update scores the top, the base and the two-key blob 0 (the keys want their 10^12-sample updates
in, whoever else sits). Mallory's and Trudy's first update is a good one (trained here on digits)
claiming all the samples its dataset registered; the next update any of the three sends, Victor's
first included, is a sealed blob whose header commits to one key while it hands out another (the
two-key blob), in a round with an honest seat to refuse it; the rest are good updates. Whatever the
draw seats, a trainer slot serves the scene still missing. Once round 1 is finalized the provider
revokes Victor's grant: from then on Victor tries to spend on every round, and its trainer slots
stay empty.

Everything observed goes into ``Log`` for the tests to assert; the scripts never raise.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from eth_account import Account
from web3 import Web3

from backend.ledger.abi import EventDecoder
from backend.ledger.client import ChainClient
from backend.ledger.contracts import FederatedLearning
from backend.ledger.resources import Deployment, RoundPhase
from fl_node.codec import content_hash, decode_model, encode_update, update_spec
from fl_node.committee import draw_committee, skip_seed
from fl_node.job import training
from tests.adversarial.hostile_chain import increase_time, mine, revert, snapshot
from tests.adversarial.hostile_member import HostileMember, KeyServer, Peer, blob_chunks, sealed
from tests.adversarial.protocol_attacks import (
    ChainLog,
    Models,
    dark,
    hex_of,
    lower,
    raw,
    wait_for,
    wait_round_finalized,
    wait_round_opened,
)

ACCOMPLICE_SCORE = 10_000
INFLATED = 10**12  # DataRegistry.MAX_SAMPLES: the most a registrant may declare (the weights job)
# Blocks mined before each attempt, 12 s apart: other numbers and times. Never 1: the start block
# gets the last mined block's timestamp while the chain's clock is ahead of the wall clock, so an
# attempt after 1 block could share the timestamp of one after none; after 2 it is 12 s later.
GRIND_BLOCKS = (0, 2, 7, 29)


@dataclass
class Log:
    """What the scripts did and saw; ``errors`` holds any script's traceback."""

    seen: dict[str, Any] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note(self, key: str, value: Any) -> None:
        with self._lock:
            self.seen[key] = value

    def add(self, **entry: Any) -> None:
        with self._lock:
            self.rounds.append(entry)


def guarded(log: Log, script: Callable[..., None], *args: Any) -> threading.Thread:
    def run() -> None:
        try:
            script(*args)
        except Exception:
            log.errors.append(traceback.format_exc())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def decoded(receipt: dict, name: str) -> dict[str, Any] | None:
    """The arguments of the first ``name`` event in a receipt's logs (None when it has none)."""
    decoder = EventDecoder()
    for entry in receipt.get("logs", []):
        event = decoder.decode(entry)
        if event is not None and event.name == name:
            return dict(event.args)
    return None


def honest_reveal(w3: Web3, deployment: Deployment, private_key: str, job_id: int) -> dict:
    """An honest node's reveal, sent here with its key: the secret its agent derives (an HMAC of
    the key, the chain, the contract and the job), so exactly the transaction the agent sends."""
    client = ChainClient(w3, Account.from_key(private_key))
    receipt = FederatedLearning(deployment.address("FederatedLearning"), client).reveal_draw_secret(job_id)
    return dict(w3.eth.get_transaction_receipt(receipt.tx_hash))


# ----------------------------------------------------------------------------- updates


def digits(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))[:rows]
    return x[order], y[order]


def trained_update(models: Models, round_: int, data: tuple[np.ndarray, np.ndarray], seed: int) -> bytes:
    """A good update: two epochs of plain SGD on digits from the round's base model (no DP: the
    hostile key releases nothing of its own), as the codec encodes an honest one."""
    config = models.config
    global_state, _ = decode_model(models.base(round_))
    model = training.build_model(config)
    model.load_state_dict(
        {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in global_state.items()}
    )
    torch.manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.from_numpy(data[0]), torch.from_numpy(data[1])
    model.train()
    for _ in range(2):
        for start in range(0, len(y), 32):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[start : start + 32]), y[start : start + 32])
            loss.backward()
            optimizer.step()
    state = model.state_dict()
    spec = update_spec(global_state)
    return encode_update({name: (state[name].detach() - global_state[name]).contiguous() for name in spec})


def junk_update(models: Models, round_: int, seed: int, scale: float = 3.0) -> bytes:
    """A well-formed update of noise, large: what an accomplice sends for its colluders to accept."""
    global_state, _ = decode_model(models.base(round_))
    generator = torch.Generator().manual_seed(seed)
    return encode_update(
        {
            name: torch.randn(shape, generator=generator) * scale
            for name, shape in update_spec(global_state).items()
        }
    )


def two_key_blob(good: bytes) -> tuple[bytes, bytes, bytes]:
    """The issue-32 attack on a sealed update: one blob meant to open to ``good`` under the key its
    trainer hands the scorers and to other bytes under the key it hands everyone else. With a
    key-committing header a blob names one key; the trainer can at best commit to one key and
    encrypt under the other (tests/jobs/test_sealed_updates.py). (blob, committed key, used key)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from backend.jobs.sealed import envelope

    committed, used = os.urandom(32), os.urandom(32)
    header = envelope.MAGIC + envelope.key_commitment(committed)
    nonce = os.urandom(envelope.NONCE_BYTES)
    return header + nonce + AESGCM(used).encrypt(nonce, good, header), committed, used


# ----------------------------------------------------------------------------- a round, as any key


class Player:
    """What every hostile script shares: the job's chain log and models, the keys' endpoint."""

    def __init__(
        self,
        w3: Web3,
        deployment: Deployment,
        peers: Sequence[Peer],
        honest: Sequence[str],
        proxy: Any,
        job_id: int,
        keys: KeyServer,
        log: Log,
        *,
        samples: dict[str, int],
        timeout_s: float,
    ) -> None:
        self.w3, self.deployment, self.peers, self.proxy = w3, deployment, peers, proxy
        # address -> the samples its updates claim: all its dataset registered
        self.samples = {a.lower(): n for a, n in samples.items()}
        self.honest = {h.lower() for h in honest}
        self.job_id, self.keys, self.log, self.timeout_s = job_id, keys, log, timeout_s
        self.chain = ChainLog(w3, deployment, job_id)
        self._models: Models | None = None
        self._models_lock = threading.Lock()

    def models(self, member: HostileMember) -> Models:
        with self._models_lock:
            if self._models is None:
                self._models = Models(member, self.peers, self.chain, self.keys)
            return self._models

    def opened(self, me: HostileMember, round_: int) -> dict | None:
        return wait_round_opened(me, self.job_id, round_, self.timeout_s)

    def finalized(self, round_: int) -> dict | None:
        event = wait_round_finalized(self.chain, round_, self.timeout_s)
        return None if event is None else dict(event.args)

    def committee(self, round_: int) -> list[str]:
        return lower(self.chain.events("RoundOpened", round_)[0].args["committee"])

    def submit(
        self, me: HostileMember, round_: int, plaintext: bytes, samples: int, state: dict, **policy
    ) -> dict:
        """Seal ``plaintext`` as an honest trainer does, put it on every honest node, serve its key,
        and submit it claiming ``samples`` (its privacy spend folded in)."""
        root, chunks, key, chash = sealed(plaintext)
        me.store_everywhere(self.peers, chunks)
        self.keys.hold(self.job_id, round_, me.address, key, **policy)
        return self.send_update(me, round_, root, samples, bytes.fromhex(chash), state) | {
            "content_hash": "0x" + chash
        }

    def send_update(
        self, me: HostileMember, round_: int, root: bytes, samples: int, chash: bytes, state: dict
    ) -> dict:
        """``submitUpdate`` of ``root`` (its privacy spend folded in where the job caps one): its
        receipt's status, and why it reverted as the contract answers the same call now (None: sent)."""
        spend = 1 if int(state["maxSpendPerRound"]) else 0
        receipt = me.submit_update(self.job_id, round_, root, samples, content_hash=chash, spend=spend)
        status = int(receipt["status"])
        update = me._update_args(self.job_id, round_, root, samples, chash, spend)
        return {
            "status": status,
            "refusal": None if status else me.refusal("FederatedLearning", "submitUpdate", **update),
        }

    def chain_now(self, state: dict) -> int:
        """The job's clock as the contract's _now reads it, at the latest block: its number when the
        job counts blocks, else its timestamp. The chain's, not this machine's: the draws job moves
        the chain's clock (hostile_chain.increase_time), and a block lands after the wall clock."""
        latest = self.w3.eth.get_block("latest")
        return int(latest["number"] if state["useBlocks"] else latest["timestamp"])

    def past(self, state: dict, deadline: int) -> bool:
        """Whether a transaction sent now lands past ``deadline``: the next block is past it once
        the latest one is (a later block never reads an earlier clock)."""
        return self.chain_now(state) > deadline

    def scoring_open(self, me: HostileMember, round_: int) -> dict:
        """Every trainer's update in (the drawn participants off the committee), or the deadline."""
        drawn = len(self.chain.drawn())

        def ready():
            state = me.job_state(self.job_id)
            if int(state["round"]) != round_ or int(state["phase"]) != RoundPhase.TRAINING:
                return {"gone": True}
            size = int(state["committeeSize"])
            late = self.past(state, int(state["updateDeadline"]))
            return state if int(state["updateCount"]) >= drawn - size or late else None

        return wait_for(ready, self.timeout_s, f"round {round_}'s scoring")

    def commits_in(self, me: HostileMember, round_: int) -> bool:
        def ready():
            state = me.job_state(self.job_id)
            if int(state["round"]) != round_ or int(state["phase"]) != RoundPhase.TRAINING:
                return "gone"
            commit_deadline = int(state["scoreDeadline"]) - int(state["scorePeriod"]) // 2
            if int(state["commitCount"]) >= int(state["committeeSize"]) or self.past(state, commit_deadline):
                return "open"
            return None

        return wait_for(ready, self.timeout_s, f"round {round_}'s commitments") == "open"

    def vote_honestly(self, me: HostileMember, round_: int) -> dict:
        """Vote for the pair the honest members compute (their aggregate, its content address):
        a seat the draw gives this key costs the round nothing."""
        data = self.models(me).expected(round_)
        root, chunks = blob_chunks(data)
        me.store_everywhere(self.peers, chunks)
        receipt = me.vote_model(self.job_id, round_, root, bytes.fromhex(content_hash(data)))
        return {"status": int(receipt["status"]), "model_hash": "0x" + content_hash(data)}

    def scores_of(self, round_: int) -> dict[str, int]:
        """The round's trainers (as submitted so far) -> their update's index."""
        return {e.args["trainer"]: int(e.args["index"]) for e in self.chain.events("UpdateSubmitted", round_)}


# ----------------------------------------------------------------------------- the draws job


class Coalition(Player):
    """Three colluding keys in the draws job (module doc)."""

    def __init__(self, *args: Any, members: Sequence[HostileMember], rounds: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.members, self.rounds = list(members), rounds
        self.addresses = {m.address.lower() for m in self.members}
        self.proposer = self.members[0]
        self.skipper_done = threading.Event()

    # -- before the start: the grinding proposer

    def grind_start(self, honest_keys: Sequence[str], blocks: Sequence[int] = GRIND_BLOCKS) -> list[dict]:
        """Start the job in one block after another, each attempt undone: the committee each draws.
        The honest nodes are cut off from the chain meanwhile (they neither see the starts nor send
        anything); their reveals are sent here with their keys, as their agents would send them."""
        attempts = []
        with dark(self.proxy):
            for count in blocks:
                mark = snapshot(self.w3)
                try:
                    mine(self.w3, count)
                    start = self.proposer.call("FederatedLearning", "startJob", jobId=self.job_id)
                    assert start["status"] == 1, start
                    block = self.w3.eth.get_block(int(start["blockNumber"]))
                    receipts = [
                        honest_reveal(self.w3, self.deployment, key, self.job_id) for key in honest_keys
                    ]
                    receipts += [member.reveal_draw(self.job_id) for member in self.members]
                    started = next(e for e in (decoded(r, "JobStarted") for r in receipts) if e is not None)
                    attempts.append(
                        {
                            "mined_before": count,
                            "start_block": int(start["blockNumber"]),
                            "start_timestamp": int(block["timestamp"]),
                            "prevrandao": hex_of(block.get("mixHash") or b""),
                            "committee": lower(started["committee"]),
                            "seed": hex_of(started["seed"]),
                        }
                    )
                finally:
                    revert(self.w3, mark)
        return attempts

    def withhold(self, honest_keys: Sequence[str], withholder: HostileMember) -> dict:
        """The last revealer's one choice, tried and undone: ``withholder`` never reveals; after the
        reveal deadline Mallory draws the committee from the others. The withholder is out of the
        job (NotDrawn), not re-rolled into it."""
        seen: dict[str, Any] = {}
        with dark(self.proxy):
            mark = snapshot(self.w3)
            try:
                assert self.proposer.call("FederatedLearning", "startJob", jobId=self.job_id)["status"] == 1
                for key in honest_keys:
                    honest_reveal(self.w3, self.deployment, key, self.job_id)
                for member in self.members:
                    if member is not withholder:
                        assert member.reveal_draw(self.job_id)["status"] == 1
                state = self.proposer.job_state(self.job_id)
                seen["before_deadline"] = self.proposer.refusal(
                    "FederatedLearning", "drawCommittee", jobId=self.job_id
                )
                latest = int(self.w3.eth.get_block("latest")["timestamp"])
                increase_time(self.w3, int(state["updateDeadline"]) - latest + 1)
                seen["late_reveal"] = withholder.refusal(
                    "FederatedLearning",
                    "revealDrawSecret",
                    jobId=self.job_id,
                    secret=withholder.draw_secrets[self.job_id],
                )
                drawn = self.proposer.call("FederatedLearning", "drawCommittee", jobId=self.job_id)
                started = decoded(drawn, "JobStarted") or {}
                seen["status"] = int(drawn["status"])
                seen["committee"] = lower(started.get("committee", []))
                seen["seed"] = hex_of(started.get("seed", b""))
                update = withholder._update_args(self.job_id, 1, os.urandom(32), 1, None, 1)
                seen["withholder_update"] = withholder.refusal("FederatedLearning", "submitUpdate", **update)
                seen["withholder_spend"] = withholder.refusal(
                    "FederatedLearning", "spendPrivacy", jobId=self.job_id, round=1, amount=1, kind=0, steps=0
                )
            finally:
                revert(self.w3, mark)
        return seen

    # -- the rounds

    def start(self) -> list[threading.Thread]:
        return [guarded(self.log, self.play, member) for member in self.members]

    def play(self, me: HostileMember) -> None:
        for round_ in range(1, self.rounds + 1):
            state = self.opened(me, round_)
            if state is None:
                continue
            committee = self.committee(round_)
            seated = [a for a in committee if a in self.addresses]
            mine_ = me.address.lower()
            if round_ == 1 and not seated:
                self.skipper_done.set()  # no colluder to finalize round 1: nothing to grind there
            if mine_ in seated:
                self.collude(me, round_, seated)
                if round_ == 1 and mine_ == seated[-1]:
                    self.skipper_done.set()  # whatever became of its reveal
            else:
                plaintext = junk_update(self.models(me), round_, seed=round_ * 1000 + int(mine_[-4:], 16))
                self.log.note(
                    f"junk_{round_}_{mine_}", self.submit(me, round_, plaintext, self.samples[mine_], state)
                )
            finalized = self.finalized(round_)
            if finalized is None:
                return
            if round_ == 1:
                self.skipper_done.wait(self.timeout_s)
            if mine_ in lower(finalized["nextCommittee"]):
                self.log.note(f"vote_{round_}_{mine_}", self.vote_honestly(me, round_))

    def collude(self, me: HostileMember, round_: int, seated: list[str]) -> None:
        """Score every hostile update ACCOMPLICE_SCORE and every honest one 0 (the base 0 too),
        by commit and reveal; the last seated colluder reveals after every other member."""
        state = self.scoring_open(me, round_)
        if state.get("gone"):
            return
        trainers = list(self.scores_of(round_))
        scores = {t: ACCOMPLICE_SCORE if t.lower() in self.addresses else 0 for t in trainers}
        salt = os.urandom(32)
        commit = me.commit_scores(self.job_id, round_, scores, 0, salt)
        self.log.note(
            f"commit_{round_}_{me.address.lower()}", {"status": int(commit["status"]), "scores": scores}
        )
        if not self.commits_in(me, round_):
            return
        if int(state["maxSpendPerRound"]):
            me.spend(self.job_id, round_, 1, kind=1)
        last = me.address.lower() == seated[-1]
        if not last:
            receipt = me.reveal_scores(self.job_id, round_, scores, 0, salt)
            self.log.note(f"reveal_{round_}_{me.address.lower()}", int(receipt["status"]))
            return
        # The last seated colluder: once every other member revealed, its reveal finalizes.
        wait_for(
            lambda: (
                len(self.chain.members("ScoresSubmitted", round_))
                >= int(me.job_state(self.job_id)["commitCount"]) - 1
                or self.past(state, int(me.job_state(self.job_id)["scoreDeadline"]) - 5)
            ),
            self.timeout_s,
            f"round {round_}'s other reveals",
        )
        if round_ != 1:
            receipt = me.reveal_scores(self.job_id, round_, scores, 0, salt)
            self.log.note(f"reveal_{round_}_{me.address.lower()}", int(receipt["status"]))
            return
        try:
            with dark(self.proxy):
                receipt = me.reveal_scores(self.job_id, round_, scores, 0, salt)
                self.log.note(f"reveal_{round_}_{me.address.lower()}", int(receipt["status"]))
                self.log.note("skipper", self.grind_skip(round_))
        finally:
            self.skipper_done.set()

    def grind_skip(self, round_: int) -> dict:
        """With the round finalized and no vote possible (the honest nodes cut off, the colluders
        holding theirs): the chain's clock past the aggregation deadline, then skipAggregation
        sent by Mallory in one block after another, each attempt undone; the committee each draws."""
        finalized = self.chain.events("RoundFinalized", round_)[0].args
        seen: dict[str, Any] = {"round_seed": hex_of(finalized["seed"]), "attempts": []}
        base = snapshot(self.w3)
        try:
            state = self.proposer.job_state(self.job_id)
            seen["too_early"] = self.proposer.refusal(
                "FederatedLearning", "skipAggregation", jobId=self.job_id, round=round_
            )
            latest = int(self.w3.eth.get_block("latest")["timestamp"])
            increase_time(self.w3, int(state["scoreDeadline"]) - latest + 1)
            for count in GRIND_BLOCKS:
                mark = snapshot(self.w3)
                try:
                    mine(self.w3, count)
                    receipt = self.proposer.call(
                        "FederatedLearning", "skipAggregation", jobId=self.job_id, round=round_
                    )
                    skipped = decoded(receipt, "AggregationSkipped") or {}
                    seen["attempts"].append(
                        {
                            "mined_before": count,
                            "status": int(receipt["status"]),
                            "block": int(receipt.get("blockNumber") or 0),
                            "committee": lower(skipped.get("committee", [])),
                            "seed": hex_of(skipped.get("seed", b"")),
                        }
                    )
                finally:
                    revert(self.w3, mark)
        finally:
            revert(self.w3, base)
        seen["expected"] = draw_committee(
            skip_seed(raw(finalized["seed"])), self.chain.drawn(), 3, banned=self.chain.banned(round_)
        )
        return seen


# ----------------------------------------------------------------------------- the weights job


class Intruders(Player):
    """Mallory, Trudy and Victor in the weights job (module doc)."""

    def __init__(
        self,
        *args: Any,
        members: Sequence[HostileMember],
        grantee: HostileMember,
        rounds: int,
        revoke: Callable[[], dict],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.members, self.grantee, self.rounds, self.revoke = list(members), grantee, rounds, revoke
        self.two_key_slot: tuple[int, str] | None = None  # (round, trainer) of the two-key blob
        self.inflated_sent = False
        self._claim = threading.Lock()
        self.revoked = threading.Event()
        self.revocation_settled = threading.Event()  # revoked, or never will be (round 1 not finalized)
        self.data = {m.address.lower(): digits(400, seed=i + 7) for i, m in enumerate(self.members)}

    def start(self) -> list[threading.Thread]:
        threads = [guarded(self.log, self.play, member) for member in self.members]
        threads.append(guarded(self.log, self.revoke_after_round_one))
        return threads

    def revoke_after_round_one(self) -> None:
        try:
            if self.finalized(1) is None:
                return
            self.log.note("revocation", self.revoke())
            self.revoked.set()
        finally:
            self.revocation_settled.set()

    def play(self, me: HostileMember) -> None:
        mine_ = me.address.lower()
        votes: list[threading.Thread] = []
        try:
            self._play(me, mine_, votes)
        finally:
            for vote in votes:
                vote.join(self.timeout_s)

    def _play(self, me: HostileMember, mine_: str, votes: list[threading.Thread]) -> None:
        for round_ in range(1, self.rounds + 1):
            state = self.opened(me, round_)
            if state is None:  # in the log: a round missed tells why a test's scene never happened
                self.log.add(round=round_, member=mine_, kind="round_gone")
                continue
            if me is self.grantee and round_ > 1:
                # Round 2 opens when round 1 is finalized, the moment the revocation starts: deciding
                # before it lands, the grantee would train and submit with a spend the revocation
                # then reverts (its slots after round 1 stay empty, module doc).
                self.revocation_settled.wait(self.timeout_s)
            revoked = me is self.grantee and self.revoked.is_set()
            if revoked:  # every release it tries now is refused on chain
                self.log.add(
                    round=round_, member=mine_, kind="spend_after_revocation", **self._try_spends(me, round_)
                )
            if mine_ in self.committee(round_):
                if not revoked:
                    self.stamp(me, round_)
            elif not revoked:
                self.train(me, round_, state)
            finalized = self.finalized(round_)
            if finalized is None:
                return
            if mine_ in lower(finalized["nextCommittee"]):
                # Beside the next round, not before it: the vote reads and aggregates the round's
                # updates, which on a loaded machine could outlast the next round's training.
                votes.append(guarded(self.log, self._vote, me, round_, mine_))

    def _vote(self, me: HostileMember, round_: int, mine_: str) -> None:
        self.log.note(f"vote_{round_}_{mine_}", self.vote_honestly(me, round_))

    def _try_spends(self, me: HostileMember, round_: int) -> dict:
        args = dict(jobId=self.job_id, round=round_, amount=1, kind=0, steps=0)
        refusal = me.refusal("FederatedLearning", "spendPrivacy", **args)
        receipt = me.call("FederatedLearning", "spendPrivacy", **args)
        update = me._update_args(self.job_id, round_, os.urandom(32), 1, None, 1)
        return {
            "spend_refusal": refusal,
            "spend_status": int(receipt["status"]),
            "update_refusal": me.refusal("FederatedLearning", "submitUpdate", **update),
        }

    def stamp(self, me: HostileMember, round_: int) -> None:
        """A rubber-stamp seat: every update scored the top but the two-key blob (0), the base 0, by
        commit and reveal."""
        state = self.scoring_open(me, round_)
        if state.get("gone"):
            return
        blob = self.two_key_slot
        scores = {
            trainer: 0 if blob == (round_, trainer.lower()) else ACCOMPLICE_SCORE
            for trainer in self.scores_of(round_)
        }
        salt = os.urandom(32)
        me.commit_scores(self.job_id, round_, scores, 0, salt)
        if not self.commits_in(me, round_):
            return
        spent = (
            int(me.spend(self.job_id, round_, 1, kind=1)["status"])
            if int(state["maxSpendPerRound"])
            else None
        )
        # what the contract would refuse the reveal with, beside its receipt (None: nothing)
        refusal = me.refusal(
            "FederatedLearning", "revealScores", **me.reveal_args(self.job_id, round_, scores, 0, salt)
        )
        receipt = me.reveal_scores(self.job_id, round_, scores, 0, salt)
        self.log.add(
            round=round_,
            member=me.address.lower(),
            kind="stamped",
            spend_status=spent,
            refusal=refusal,
            status=int(receipt["status"]),
        )

    def train(self, me: HostileMember, round_: int, state: dict) -> None:
        models = self.models(me)
        good = trained_update(models, round_, self.data[me.address.lower()], seed=round_)
        # The scenes (module doc): Mallory's and Trudy's first update a good inflated one, the next
        # update any of them sends the two-key blob, if an honest seat is there to refuse it.
        inflated = self.samples[me.address.lower()] == INFLATED
        refused_by_someone = any(a in self.honest for a in self.committee(round_))
        with self._claim:
            two_key = (
                self.two_key_slot is None and (not inflated or self.inflated_sent) and refused_by_someone
            )
            if two_key:
                self.two_key_slot = (round_, me.address.lower())
            self.inflated_sent = self.inflated_sent or (inflated and not two_key)
        samples = self.samples[me.address.lower()]
        if not two_key:
            sent = self.submit(me, round_, good, samples, state)
            self.log.add(round=round_, member=me.address.lower(), kind="good", samples=samples, **sent)
            return
        blob, committed, used = two_key_blob(good)
        root, chunks = blob_chunks(blob)
        me.store_everywhere(self.peers, chunks)
        answers: dict[str, int] = {}

        def policy(_job: int, _round: int, _trainer: str, requester: str) -> str:
            # The key that decrypts it to the good update first (not the one it commits to), the
            # committed one (which does not open it) afterwards: what each reader is handed.
            answers[requester] = answers.get(requester, 0) + 1
            return (used if answers[requester] == 1 else committed).hex()

        self.keys.hold(self.job_id, round_, me.address, committed, policy=policy)
        chash = content_hash(good)
        sent = self.send_update(me, round_, root, samples, bytes.fromhex(chash), state)
        self.log.note(
            "two_key",
            {
                "round": round_,
                "member": me.address.lower(),
                "grantee": me is self.grantee,
                **sent,
                "content_hash": "0x" + chash,
                "answers": answers,
            },
        )
