"""A hostile pair inside a running job: the protocol attacks of issue 14, scripted per role.

Two hostile keys (``HostileMember``: raw transactions, signed peer requests) sit in a job of
three honest nodes with a committee of 3 and two trainers a round. The rotation is fixed by the
committee rule once round 1 is drawn: the next committee is the round's ranked trainers (an
honest one first, the hostile one's junk last), then seat 0 of the current committee; the
round's trainers are the other two seats. The run needs the drawn round-1 committee to hold
exactly one hostile key, off seat 0 (``steady``): then every round has one hostile trainer
and one hostile scorer, and every aggregating committee one hostile member and two honest ones.

Round 1 (``round_one_trainer`` / ``round_one_scorer``):
- trainer: claims more samples than its registered dataset (SamplesAboveDataset), resubmits
  the honest trainer's reference and content hash (DuplicateContent), then submits that
  reference with another hash (taken, scored 0 by every honest member: it does not open to
  its hash);
- scorer: reads the others' scores before committing (none can be read), reveals before
  committing (NotCommitted), commits to 10000 for its partner's copy and 0 for the base model,
  reveals before the others committed (RevealNotOpen), reveals other scores than committed
  (CommitmentMismatch), then reveals what it committed: 1 colluder of 3 against 2 honest;
- the trainer, now on the aggregating committee, computes the right aggregate before the round
  finalizes and proposes its hash with an oversized (1 TiB span-bomb) reference the moment the
  round aggregates (usually before the honest members: a race it may lose, then its pair is a
  second proposal).
Round 2: the round-1 trainer sits on the scoring committee and never commits or reveals; the
round-1 scorer trains (a garbage update) and then sits on the aggregating committee and never
proposes or confirms.

Everything observed goes into ``Report`` for the tests to assert; the scripts never raise.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eth_utils import event_abi_to_log_topic, keccak
from web3 import Web3

from backend.jobs.config import JobConfig
from backend.ledger.abi import DecodedEvent, EventDecoder
from backend.ledger.artifacts import load_artifact
from backend.ledger.resources import Deployment, JobStatus, RoundPhase
from fl_node.aggregate import WeightedUpdate, get_strategy
from fl_node.codec import content_hash, decode_model, decode_update, encode_model, update_spec
from tests.adversarial.hostile_member import (
    HostileMember,
    Peer,
    blob_chunks,
    read_blob,
    span_bomb,
    update_plaintext,
)

SAMPLES = 200  # each hostile key's registered dataset size (and its updates' claim)
JUNK_SCORE = 10_000  # the colluder's score of its partner's copy
MAX_MODEL_BYTES = 64 << 20
MAX_SCORE = 10_000


def hex_of(value: Any) -> str:
    """0x-hex, lower case, of bytes or a hex string."""
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    return "0x" + str(value).lower().removeprefix("0x")


def raw(value: Any) -> bytes:
    return (
        bytes(value) if isinstance(value, bytes | bytearray) else bytes.fromhex(str(value).removeprefix("0x"))
    )


def proposals_bind_reference() -> bool:
    """Whether this contract keys a proposal by its model hash AND its reference (a confirmation
    names both): without it an honest confirmer votes for a right hash with any reference."""
    abi = load_artifact("FederatedLearning").abi
    confirm = next(i for i in abi if i["type"] == "function" and i["name"] == "confirmGlobalModel")
    return any(i["name"] == "modelRef" for i in confirm["inputs"])


class ChainLog:
    """FederatedLearning's events of one job, decoded (a small chain: read from block 0)."""

    def __init__(self, w3: Web3, deployment: Deployment, job_id: int) -> None:
        self.w3, self.job_id = w3, job_id
        self.address = deployment.address("FederatedLearning")
        self.decoder = EventDecoder()
        abi = load_artifact("FederatedLearning").abi
        self.topics = {i["name"]: event_abi_to_log_topic(i) for i in abi if i["type"] == "event"}

    def events(self, name: str, round_: int | None = None) -> list[DecodedEvent]:
        logs = self.w3.eth.get_logs(
            {
                "fromBlock": 0,
                "address": self.address,
                "topics": [self.topics[name], self.job_id.to_bytes(32, "big")],
            }
        )
        decoded = [self.decoder.decode(log) for log in logs]
        return [
            e for e in decoded if e is not None and (round_ is None or int(e.args.get("round", -1)) == round_)
        ]


@dataclass
class Roles:
    """Who does what in the run (addresses), from the drawn round-1 committee."""

    committee: list[str]
    trainer: HostileMember  # round 1's hostile trainer; round 2's silent scorer
    scorer: HostileMember  # round 1's colluding scorer; round 2's trainer and silent aggregator


def steady(committee: Sequence[str], hostile: Sequence[str]) -> bool:
    """Exactly one hostile key on the committee, and not on seat 0 (see the module's docstring)."""
    bad = {h.lower() for h in hostile}
    return committee[0].lower() not in bad and sum(c.lower() in bad for c in committee) == 1


@dataclass
class Report:
    """What the scripts did and saw; ``errors`` holds any script's traceback."""

    attempts: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def note(self, key: str, value: Any) -> None:
        self.attempts[key] = value


def attempt(member: HostileMember, contract: str, function: str, **args: Any) -> dict[str, Any]:
    """Name the refusal (eth_call), then send the same call raw: {'error', 'status'}."""
    error = member.refusal(contract, function, **args)
    receipt = member.call(contract, function, **args)
    return {"error": error, "status": int(receipt["status"]), "block": int(receipt.get("blockNumber") or 0)}


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, period_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(period_s)
    raise TimeoutError(f"waited {timeout_s:.0f}s for {what}")


# ----------------------------------------------------------------------------- the models


def aggregate_of(base: bytes, updates: Sequence[tuple[bytes, int, str]], config: JobConfig) -> bytes:
    """The round's model as an honest member computes it (backend/jobs/driver/aggregator.py):
    ``updates`` are the accepted ones, (plaintext, samples, content hash), in acceptance order,
    a content hash counted once."""
    global_state, server_state = decode_model(base)
    spec = update_spec(global_state)
    seen: set[str] = set()
    weighted = []
    for blob, samples, chash in updates:
        if chash in seen:
            continue
        seen.add(chash)
        weighted.append(WeightedUpdate(decode_update(blob, spec), int(samples), chash))
    if not weighted:
        return encode_model(global_state, server_state or None)
    strategy = get_strategy(config.strategy, **config.strategy_params)
    new_state, new_server = strategy.aggregate(global_state, weighted, server_state or None)
    return encode_model(new_state, new_server or None)


class Models:
    """The job's models and updates as a participant reads them from the honest nodes, cached."""

    def __init__(self, member: HostileMember, peers: Sequence[Peer], log: ChainLog) -> None:
        self.member, self.peers, self.log = member, peers, log
        self._blobs: dict[str, bytes] = {}
        self._updates: dict[tuple[int, str], bytes] = {}
        spec = log.events("JobProposed")[0].args["spec"]
        self.initial = (spec["initialModelRef"], hex_of(spec["initialModelHash"]))
        self.config = JobConfig.from_bytes(self.blob(hex_of(spec["configHash"])))

    def blob(self, reference: str) -> bytes:
        if reference not in self._blobs:
            self._blobs[reference] = read_blob(self.member, self.peers, reference, max_bytes=MAX_MODEL_BYTES)
        return self._blobs[reference]

    def update(self, round_: int, event: DecodedEvent) -> bytes:
        key = (round_, event.args["trainer"].lower())
        if key not in self._updates:
            self._updates[key] = update_plaintext(
                self.member, self.peers, self.log.job_id, round_, event.args, max_bytes=MAX_MODEL_BYTES
            )
        return self._updates[key]

    def base(self, round_: int) -> bytes:
        """The model round ``round_`` starts from (the previous fixed one, or carried forward)."""
        while round_ > 1:
            fixed = self.fixed(round_ - 1)
            if fixed is not None:
                return self.blob(fixed[0])
            round_ -= 1  # skipped: the model was carried forward
        data = self.blob(self.initial[0])
        assert content_hash(data) == self.initial[1].removeprefix("0x")
        return data

    def fixed(self, round_: int) -> tuple[str, str] | None:
        """(reference, hash) of the round's fixed model, its reference the proposed one whose
        digest GlobalModelFixed names; None when no model was fixed."""
        fixed = self.log.events("GlobalModelFixed", round_)
        if not fixed:
            return None
        model_hash, digest = hex_of(fixed[0].args["modelHash"]), hex_of(fixed[0].args["referenceDigest"])
        for proposal in self.log.events("GlobalModelProposed", round_):
            reference = hex_of(proposal.args["modelRef"])
            if hex_of(proposal.args["modelHash"]) == model_hash and hex_of(keccak(raw(reference))) == digest:
                return reference, model_hash
        raise AssertionError(f"round {round_}: no proposal has the fixed hash and reference digest")

    def expected(self, round_: int) -> bytes:
        """The aggregate of the round's accepted updates over its base: what must be fixed."""
        finalized = self.log.events("RoundFinalized", round_)[0]
        submitted = {e.args["trainer"].lower(): e for e in self.log.events("UpdateSubmitted", round_)}
        accepted = [submitted[a.lower()] for a in finalized.args["accepted"]]
        updates = [
            (self.update(round_, e), int(e.args["samples"]), hex_of(e.args["contentHash"])) for e in accepted
        ]
        return aggregate_of(self.base(round_), updates, self.config)


# ----------------------------------------------------------------------------- the scripts


class HostilePair:
    def __init__(
        self,
        w3: Web3,
        deployment: Deployment,
        peers: Sequence[Peer],
        honest: Sequence[str],
        job_id: int,
        roles: Roles,
        report: Report,
        *,
        hijack: bool,
        timeout_s: float,
    ) -> None:
        self.w3, self.peers, self.job_id, self.roles, self.report = w3, peers, job_id, roles, report
        self.honest = {h.lower() for h in honest}
        self.log = ChainLog(w3, deployment, job_id)
        self.hijack, self.timeout_s = hijack, timeout_s
        self.bomb_root, self.bomb = span_bomb()

    def start(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._guarded, args=(self.round_one_trainer,), daemon=True),
            threading.Thread(target=self._guarded, args=(self.round_one_scorer,), daemon=True),
        ]
        for thread in threads:
            thread.start()
        return threads

    def _guarded(self, script: Callable[[], None]) -> None:
        try:
            script()
        except Exception:
            self.report.errors.append(traceback.format_exc())

    def _state(self, member: HostileMember) -> dict[str, Any]:
        return member.job_state(self.job_id)

    def _in_round(self, member: HostileMember, round_: int, phase: int) -> dict | None:
        state = self._state(member)
        if state["status"] != JobStatus.RUNNING:
            raise RuntimeError(f"the job is no longer running: {state['status']}")
        if int(state["round"]) == round_ and int(state["phase"]) == phase:
            return state
        return None

    def _finalized(self, round_: int) -> DecodedEvent:
        return wait_for(
            lambda: (self.log.events("RoundFinalized", round_) or [None])[0],
            self.timeout_s,
            f"round {round_} finalized",
        )

    def _spend(self, state: dict) -> int:
        return 1 if int(state["maxSpendPerRound"]) else 0

    # -- round 1: the trainer, then a hijacking aggregator; round 2: a silent scorer

    def round_one_trainer(self) -> None:
        me, note = self.roles.trainer, self.report.note
        state = wait_for(lambda: self._in_round(me, 1, RoundPhase.TRAINING), self.timeout_s, "round 1")
        honest = wait_for(
            lambda: [
                e for e in self.log.events("UpdateSubmitted", 1) if e.args["trainer"].lower() in self.honest
            ],
            self.timeout_s,
            "the honest trainer's round-1 update",
        )[0]
        reference, chash = raw(honest.args["modelRef"]), raw(honest.args["contentHash"])
        spend = self._spend(state)
        args = me._update_args(self.job_id, 1, reference, SAMPLES, chash, spend)
        note(
            "inflated_samples",
            attempt(me, "FederatedLearning", "submitUpdate", **dict(args, samples=SAMPLES + 1)),
        )
        note("exact_copy", attempt(me, "FederatedLearning", "submitUpdate", **args))
        note(
            "copy_other_hash",
            attempt(me, "FederatedLearning", "submitUpdate", **dict(args, contentHash=os.urandom(32))),
        )
        note("copied_from", honest.args["trainer"])

        # Training is over (both updates are in): read what an honest aggregator will read, and
        # compute the aggregate the honest members will accept (the honest update alone) before
        # the round finalizes, to propose it the moment the round aggregates.
        models = Models(me, self.peers, self.log)
        plaintext = models.update(1, honest)
        predicted = aggregate_of(
            models.base(1),
            [(plaintext, int(honest.args["samples"]), hex_of(honest.args["contentHash"]))],
            models.config,
        )
        if self.hijack:
            wait_for(
                lambda: self._in_round(me, 1, RoundPhase.AGGREGATING),
                self.timeout_s,
                "round 1's aggregation",
                0.05,
            )
        finalized = self._finalized(1)
        note("round1_next_committee", finalized.args["nextCommittee"])
        if not self.hijack:
            note("hijack", {"sent": False, "why": "this contract keys proposals by the model hash alone"})
        else:
            data = predicted
            if [a.lower() for a in finalized.args["accepted"]] != [honest.args["trainer"].lower()]:
                try:
                    data = models.expected(1)
                except Exception as exc:  # an accepted update nobody can read: no model to hijack
                    note("hijack", {"sent": False, "why": f"no aggregate: {exc!r}"[:300]})
                    return
            model_hash = bytes.fromhex(content_hash(data))
            receipt = me.propose_model(self.job_id, 1, self.bomb_root, model_hash)
            note(
                "hijack",
                {
                    "sent": True,
                    "status": int(receipt["status"]),
                    "block": int(receipt.get("blockNumber") or 0),
                    "model_hash": hex_of(model_hash),
                    "reference": hex_of(self.bomb_root),
                    "honest_reference": hex_of(blob_chunks(data)[0]),
                },
            )
        # Round 2: on the scoring committee, silent; the rest is read from the chain afterwards.

    # -- round 1: the colluding scorer; round 2: a trainer of garbage, then a silent aggregator

    def round_one_scorer(self) -> None:
        me, note = self.roles.scorer, self.report.note
        state = wait_for(
            lambda: (s := self._in_round(me, 1, RoundPhase.TRAINING)) and int(s["updateCount"]) >= 2 and s,
            self.timeout_s,
            "round 1's scoring (both updates in)",
        )
        updates = self.log.events("UpdateSubmitted", 1)
        partner = self.roles.trainer.address
        # Before committing: nobody's scores can be read (storage and events hold none).
        note(
            "before_commit",
            {
                "packed_scores": [me.packed_scores(self.job_id, 1, int(u.args["index"])) for u in updates],
                "scores_events": len(self.log.events("ScoresSubmitted", 1)),
                "commitments": [hex_of(e.args["commitment"]) for e in self.log.events("ScoresCommitted", 1)],
            },
        )
        scores, base, salt = {partner: JUNK_SCORE}, 0, os.urandom(32)
        note(
            "reveal_before_commit",
            attempt(
                me, "FederatedLearning", "revealScores", **me.reveal_args(self.job_id, 1, scores, base, salt)
            ),
        )
        receipt = me.commit_scores(self.job_id, 1, scores, base, salt)
        note("commit", {"status": int(receipt["status"])})
        committed = int(self._state(me)["commitCount"])
        # Other scores than committed: refused as early (RevealNotOpen) whether or not the
        # commitments are all in by the time it is mined (then CommitmentMismatch), never taken.
        tailored = {partner: JUNK_SCORE - 1}
        early = attempt(
            me, "FederatedLearning", "revealScores", **me.reveal_args(self.job_id, 1, tailored, base, salt)
        )
        note("reveal_before_all_committed", dict(early, commits_then=committed))
        state = wait_for(
            lambda: (
                (s := self._state(me))
                and (
                    int(s["commitCount"]) >= int(s["committeeSize"])
                    or time.time() > int(s["scoreDeadline"]) - int(s["scorePeriod"]) // 2 + 1
                )
                and s
            ),
            self.timeout_s,
            "every member's commitment (or the commit deadline)",
        )
        note(
            "reveal_other_scores",
            attempt(
                me,
                "FederatedLearning",
                "revealScores",
                **me.reveal_args(self.job_id, 1, tailored, base, salt),
            ),
        )
        receipt = me.reveal_scores(self.job_id, 1, scores, base, salt)
        note("reveal", {"status": int(receipt["status"]), "scores": scores, "base": base})

        # Round 2: a trainer of garbage (its real hash: only its content is bad).
        state = wait_for(lambda: self._in_round(me, 2, RoundPhase.TRAINING), self.timeout_s, "round 2")
        garbage = os.urandom(20_000)
        root, chunks = blob_chunks(garbage)
        me.store_everywhere(self.peers, chunks)
        receipt = me.submit_update(
            self.job_id,
            2,
            root,
            SAMPLES,
            content_hash=bytes.fromhex(content_hash(garbage)),
            spend=self._spend(state),
        )
        note("round2_garbage", {"status": int(receipt["status"])})
        # then, on round 2's aggregating committee: silent.
