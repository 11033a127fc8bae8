"""A hostile pair inside a running job: the protocol attacks of issue 14, scripted per role.

Two hostile keys (``HostileMember``: raw transactions, signed peer requests, a key server as their
registered endpoint) sit in a job of three honest nodes with a committee of 3 and two trainers a
round. Every committee is DRAWN by the contract (the first from the participants' committed draw
secrets, each next one from the round's seed, uniformly over the participants): nobody, the
attackers included, chooses who sits. So the scripts read their roles from the chain round by
round, and do what a hostile member in that role can. The run needs the drawn round-1 committee
to hold exactly one hostile key (``steady``): then round 1 has one hostile trainer and one
hostile scorer.

Round 1 (``round_one_trainer`` / ``round_one_scorer``):
- trainer: claims more samples than its registered dataset (SamplesAboveDataset), resubmits
  the honest trainer's reference and content hash (DuplicateContent), then submits that
  reference with another hash (taken; it serves the honest trainer's key for it, which opens the
  blob to bytes of another hash: every honest member scores it 0);
- scorer: reads the others' scores before committing (none can be read), reveals before
  committing (NotCommitted), commits to 10000 for its partner's copy and 0 for the base model,
  reveals before the others committed (RevealNotOpen), reveals other scores than committed
  (CommitmentMismatch), then reveals what it committed: 1 colluder of 3 against 2 honest. It
  reveals LAST: with every other salt on chain it predicts the next committee from the job's
  random state before its reveal (the last revealer's only choice is to reveal or to withhold,
  and withholding bans it), and its reveal finalizes the round;
- the hijack: with the honest nodes cut off from the chain across that finalizing reveal (their
  RPC endpoint dark for a few seconds: they cannot vote before it), a hostile key the draw seated on round 1's aggregating committee votes for the
  right model hash (the honest aggregation, recomputed) with an oversized reference (a 1 TiB span
  bomb): the first vote of the round, so the pair exists on chain; the honest members then vote
  their own pair.
Rounds 2 and on: a hostile key the draw seats to score never commits or reveals (a silent seat);
one seated to aggregate never votes; one that trains submits garbage.

Everything observed goes into ``Report`` for the tests to assert; the scripts never raise.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from eth_utils import event_abi_to_log_topic, keccak
from web3 import Web3

from backend.ledger.abi import DecodedEvent, EventDecoder
from backend.ledger.artifacts import load_artifact
from backend.ledger.resources import Deployment, JobStatus, RoundPhase
from fl_node.aggregate import WeightedUpdate
from fl_node.codec import CodecError, content_hash, decode_model, decode_update, encode_model, update_spec
from fl_node.committee import draw_committee, mix_in, round_seed
from fl_node.job.aggregation import strategy as job_strategy
from fl_node.job.config import JobConfig
from fl_node.robust import (
    aggregation_clip_norm,
    defended_aggregate,
    get_defense,
    update_norm,
    vote_roles,
    vote_signs,
    within_norm_bound,
)
from tests.adversarial.hostile_member import (
    KEY_PATH,
    HostileMember,
    KeyServer,
    NoKey,
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

    def members(self, name: str, round_: int, field: str = "member") -> set[str]:
        return {e.args[field].lower() for e in self.events(name, round_)}

    def drawn(self) -> list[str]:
        """The participants that revealed their draw secret: every committee is drawn from them."""
        return [e.args["node"].lower() for e in self.events("DrawSecretRevealed")]

    def banned(self, through_round: int) -> list[str]:
        """Members that withheld a reveal of scores they committed to, up to ``through_round``."""
        return [
            e.args["member"].lower()
            for e in self.events("ScoresWithheld")
            if e.args["round"] <= through_round
        ]


def lower(addresses: Sequence[str]) -> list[str]:
    return [a.lower() for a in addresses]


@dataclass
class Roles:
    """Who does what in round 1 (addresses), from the drawn round-1 committee."""

    committee: list[str]
    trainer: HostileMember  # round 1's hostile trainer (the copier)
    scorer: HostileMember  # round 1's colluding scorer (the last revealer)


def steady(committee: Sequence[str], hostile: Sequence[str]) -> bool:
    """Exactly one hostile key on the committee: one hostile trainer, one hostile scorer."""
    bad = {h.lower() for h in hostile}
    return sum(c.lower() in bad for c in committee) == 1


@dataclass
class Report:
    """What the scripts did and saw; ``errors`` holds any script's traceback."""

    attempts: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seats: list[dict[str, Any]] = field(default_factory=list)  # (round, kind, member): silent seats
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note(self, key: str, value: Any) -> None:
        with self._lock:
            self.attempts[key] = value

    def seat(self, round_: int, kind: str, member: str, what: str) -> None:
        with self._lock:
            self.seats.append({"round": round_, "kind": kind, "member": member.lower(), "did": what})


def attempt(
    member: HostileMember, contract: str, function: str, *, at_block: int | None = None, **args: Any
) -> dict[str, Any]:
    """Name the refusal (eth_call, on the latest block or on ``at_block``), then send the same call
    raw: {'error', 'status'}."""
    error = member.refusal(contract, function, at_block=at_block, **args)
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


@contextlib.contextmanager
def dark(proxy: Any) -> Iterator[None]:
    """The honest nodes cut off from the chain for the block (their RPC endpoint, a TcpProxy,
    refuses every connection; tests/faults/faultnet.py), back after it whatever happens: for a
    few seconds they can neither see a block nor send a transaction, as behind a network fault.
    Their peer API (blobs, and keys already released) keeps answering; the test's own chain
    calls go to the chain directly."""
    proxy.go_dark()
    try:
        yield
    finally:
        proxy.come_back()


# ----------------------------------------------------------------------------- the models


class Models:
    """The job's models and updates as a participant reads them from the honest nodes, cached, and
    each round's model as an honest member aggregates it (backend/jobs/driver/aggregator.py), from
    the chain's events and the blobs alone."""

    def __init__(
        self, member: HostileMember, peers: Sequence[Peer], log: ChainLog, known: KeyServer | None = None
    ) -> None:
        self.member, self.peers, self.log, self.known = member, peers, log, known
        self._blobs: dict[str, bytes] = {}
        self._updates: dict[tuple[int, str], bytes | None] = {}
        spec = log.events("JobProposed")[0].args["spec"]
        self.initial = (spec["initialModelRef"], hex_of(spec["initialModelHash"]))
        self.config = JobConfig.from_bytes(self.blob(hex_of(spec["configHash"])))

    def blob(self, reference: str) -> bytes:
        if reference not in self._blobs:
            self._blobs[reference] = read_blob(self.member, self.peers, reference, max_bytes=MAX_MODEL_BYTES)
        return self._blobs[reference]

    def update(self, round_: int, event: DecodedEvent) -> bytes | None:
        """An update's plaintext, or None where no honest node can read it either: no holder gave
        the key it commits to, or it does not open to its content hash (or is no sealed update)."""
        from backend.jobs.sealed.envelope import SealError
        from backend.swarm.errors import SwarmError

        key = (round_, event.args["trainer"].lower())
        if key not in self._updates:
            try:
                self._updates[key] = update_plaintext(
                    self.member,
                    self.peers,
                    self.log.job_id,
                    round_,
                    event.args,
                    max_bytes=MAX_MODEL_BYTES,
                    known=self.known,
                )
            except (SealError, NoKey, SwarmError, ValueError):
                self._updates[key] = None
        return self._updates[key]

    def base(self, round_: int) -> bytes:
        """The model round ``round_`` starts from (the previous fixed one, or carried forward)."""
        while round_ > 1:
            fixed = self.fixed(round_ - 1)
            if fixed is not None:
                return self.blob(fixed[0])
            round_ -= 1  # skipped (or void): the model was carried forward
        data = self.blob(self.initial[0])
        assert content_hash(data) == self.initial[1].removeprefix("0x")
        return data

    def fixed(self, round_: int) -> tuple[str, str] | None:
        """(reference, hash) of the round's fixed model, its reference the voted one whose digest
        GlobalModelFixed names; None when no model was fixed."""
        fixed = self.log.events("GlobalModelFixed", round_)
        if not fixed:
            return None
        model_hash, digest = hex_of(fixed[0].args["modelHash"]), hex_of(fixed[0].args["referenceDigest"])
        for vote in self.log.events("GlobalModelVoted", round_):
            reference = hex_of(vote.args["modelRef"])
            if hex_of(vote.args["modelHash"]) == model_hash and hex_of(keccak(raw(reference))) == digest:
                return reference, model_hash
        raise AssertionError(f"round {round_}: no vote has the fixed hash and reference digest")

    def decoded(self, round_: int, event: DecodedEvent, spec: dict) -> Any:
        plaintext = self.update(round_, event)
        if plaintext is None:
            return None
        try:
            return decode_update(plaintext, spec)
        except CodecError:
            return None

    def expected(self, round_: int, *, max_share_bp: int | None = None) -> bytes:
        """The round's model as every honest member computes it: the job's defense
        (fl_node.robust.defended_aggregate) over the accepted updates, with the clip norm, the sign
        votes and the backers of the round's readable submissions that some member scored above 0,
        split by the chain's medians (vote_roles); each update's weight its claimed samples,
        bounded by the job's max_share_bp (or by ``max_share_bp``: what another cap would give)."""
        config = self.config
        finalized = self.log.events("RoundFinalized", round_)[0].args
        medians = dict(zip(lower(finalized["trainers"]), (int(m) for m in finalized["medians"]), strict=True))
        submitted = sorted(self.log.events("UpdateSubmitted", round_), key=lambda e: int(e.args["index"]))
        by_trainer = {e.args["trainer"].lower(): e for e in submitted}
        scored = {
            t.lower()
            for e in self.log.events("ScoresSubmitted", round_)
            for t, s in zip(e.args["trainers"], e.args["scores"], strict=True)
            if int(s) > 0
        }
        global_state, server_state = decode_model(self.base(round_))
        spec = update_spec(global_state)
        defense = get_defense(config.defense).round_defense(
            top_k=config.top_k,
            norm_bound=config.norm_bound or None,
            max_share_bp=config.max_share_bp if max_share_bp is None else max_share_bp,
        )
        clip_norm, voters, witnesses, backers = None, [], [], []
        if defense.needs_votes:
            first: dict[str, DecodedEvent] = {}
            for e in submitted:
                first.setdefault(hex_of(e.args["contentHash"]), e)
            norms, votes, kept = {}, {}, {}
            for e in first.values():
                trainer = e.args["trainer"].lower()
                if trainer not in scored:
                    continue
                update = self.decoded(round_, e, spec)
                if update is None or not within_norm_bound(update, defense.norm_bound):
                    continue
                norms[trainer], votes[trainer], kept[trainer] = (
                    update_norm(update),
                    vote_signs(update),
                    update,
                )
            voting, witnessing = vote_roles(
                list(norms),
                medians,
                base_median=int(finalized["baseMedian"]),
                margin=int(finalized["margin"]),
            )
            clip_norm = aggregation_clip_norm([norms[t] for t in voting], [norms[t] for t in witnessing])
            voters = [votes[t] for t in voting if votes[t] is not None]
            witnesses = [votes[t] for t in witnessing if votes[t] is not None]
            # the backed magnitude's median over voters and witnesses alike, as every member takes it
            # (backend/jobs/driver/aggregator._round_votes, fl_node.simulate._round_votes)
            backers = [kept[t] for t in (*voting, *witnessing)] if defense.backed_magnitude else []
        seen: set[str] = set()
        weighted = []
        for trainer in lower(finalized["accepted"]):
            e = by_trainer[trainer]
            chash = hex_of(e.args["contentHash"])
            if chash in seen:
                continue
            seen.add(chash)
            update = self.decoded(round_, e, spec)
            if update is None:
                raise AssertionError(f"round {round_}: accepted {trainer}'s update cannot be read")
            weighted.append(WeightedUpdate(update, int(e.args["samples"]), chash.removeprefix("0x")))
        new_state, new_server = defended_aggregate(
            job_strategy(config),
            global_state,
            weighted,
            defense=defense,
            server_state=(server_state or None) if weighted else server_state,
            clip_norm=clip_norm,
            voters=voters,
            witnesses=witnesses,
            backers=backers,
        )
        return encode_model(new_state, new_server or None)


def wait_round_opened(member: HostileMember, job_id: int, round_: int, timeout_s: float) -> dict | None:
    """The job's state once round ``round_`` trains, read with ``member``'s key; None when the job
    went past it (a void round after a skipped aggregation) or ended. A job not started yet, or
    whose first committee is not drawn yet, is waited for."""

    def seen():
        state = member.job_state(job_id)
        if state["status"] in (JobStatus.OPEN, JobStatus.DRAWING):
            return None
        if state["status"] != JobStatus.RUNNING:
            return {"gone": True}
        current, phase = int(state["round"]), int(state["phase"])
        if current > round_ or (current == round_ and phase != RoundPhase.TRAINING):
            return {"gone": True}
        return state if current == round_ else None

    state = wait_for(seen, timeout_s, f"round {round_}")
    return None if state.get("gone") else state


def wait_round_finalized(log: ChainLog, round_: int, timeout_s: float) -> DecodedEvent | None:
    """Round ``round_``'s RoundFinalized event; None when the job failed or was cancelled first."""

    def seen():
        events = log.events("RoundFinalized", round_)
        if events:
            return events[0]
        if log.events("JobFailed") or log.events("JobCancelled"):
            return "ended"
        return None

    event = wait_for(seen, timeout_s, f"round {round_} finalized")
    return None if event == "ended" else event


def predicted_next_committee(member: HostileMember, log: ChainLog, round_: int, salt: bytes) -> list[str]:
    """The committee the round's finalization will draw if ``member`` reveals ``salt`` last, read
    before its reveal: the job's random state (every secret and salt revealed so far, XORed, and
    the last seed) is public, so the last revealer knows the draw it completes. Its only choice is
    to reveal or to withhold, and withholding bans it from every later seat."""
    state = member.job_state(log.job_id)
    mix = mix_in(raw(state["mix"]), salt, member.address)
    seed = round_seed(raw(state["seed"]), mix, round_)
    return draw_committee(seed, log.drawn(), int(state["committeeSize"]), banned=log.banned(round_))


# ----------------------------------------------------------------------------- the scripts


class HostilePair:
    def __init__(
        self,
        w3: Web3,
        deployment: Deployment,
        peers: Sequence[Peer],
        honest: Sequence[str],
        proxy: Any,
        job_id: int,
        roles: Roles,
        keys: KeyServer,
        report: Report,
        *,
        rounds: int,
        timeout_s: float,
    ) -> None:
        self.w3, self.peers, self.job_id, self.roles, self.report = w3, peers, job_id, roles, report
        self.honest = {h.lower() for h in honest}
        self.proxy, self.keys, self.rounds = proxy, keys, rounds
        self.log = ChainLog(w3, deployment, job_id)
        self._models: Models | None = None
        self._models_lock = threading.Lock()
        self.timeout_s = timeout_s
        self.bomb_root, self.bomb = span_bomb()
        self.pair = [roles.trainer, roles.scorer]

    def start(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._guarded, args=(self.play, member), daemon=True)
            for member in self.pair
        ]
        for thread in threads:
            thread.start()
        return threads

    def models(self, member: HostileMember) -> Models:
        """The job's models and updates as the pair reads them (one cache for both scripts)."""
        with self._models_lock:
            if self._models is None:
                self._models = Models(member, self.peers, self.log, self.keys)
            return self._models

    def _guarded(self, script: Callable[..., None], *args: Any) -> None:
        try:
            script(*args)
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

    def _round_opened(self, member: HostileMember, round_: int) -> dict | None:
        return wait_round_opened(member, self.job_id, round_, self.timeout_s)

    def _finalized(self, round_: int) -> DecodedEvent | None:
        return wait_round_finalized(self.log, round_, self.timeout_s)

    def _spend(self, state: dict) -> int:
        return 1 if int(state["maxSpendPerRound"]) else 0

    def play(self, me: HostileMember) -> None:
        """Round 1 by the role the first draw gave ``me``, then every later round by the seat each
        draw gives it: silent on a committee, garbage as a trainer."""
        if me is self.roles.trainer:
            self.round_one_trainer(me)
        else:
            self.round_one_scorer(me)
        for round_ in range(2, self.rounds + 1):
            state = self._round_opened(me, round_)
            if state is None:
                continue
            committee = lower(self.log.events("RoundOpened", round_)[0].args["committee"])
            if me.address.lower() in committee:
                self.report.seat(round_, "score", me.address, "silent: never commits or reveals")
            else:
                self.garbage(me, round_, state)
            finalized = self._finalized(round_)
            if finalized is not None and me.address.lower() in lower(finalized.args["nextCommittee"]):
                self.report.seat(round_, "aggregate", me.address, "silent: never votes")

    def garbage(self, me: HostileMember, round_: int, state: dict) -> None:
        """A trainer of garbage (its real hash: only its content is bad, and it is no sealed update)."""
        garbage = os.urandom(20_000)
        root, chunks = blob_chunks(garbage)
        me.store_everywhere(self.peers, chunks)
        receipt = me.submit_update(
            self.job_id,
            round_,
            root,
            SAMPLES,
            content_hash=bytes.fromhex(content_hash(garbage)),
            spend=self._spend(state),
        )
        self.report.note(f"round{round_}_garbage_{me.address.lower()}", {"status": int(receipt["status"])})

    # -- round 1: the copier (trainer)

    def round_one_trainer(self, me: HostileMember) -> None:
        note = self.report.note
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
        # Training is over (both updates are in): the copier asks the honest trainer's key as any
        # participant may, and serves it for its copy. The key is the one the blob commits to, so
        # every reader opens the blob, to bytes whose hash is not the copy's: rejected everywhere.
        key = None
        asked = json.dumps({"job": self.job_id, "round": 1, "trainer": honest.args["trainer"]}).encode()
        for peer in self.peers:
            answer = me.peer_post(peer, KEY_PATH, asked, timeout=30)
            if answer.status_code == 200:
                key = bytes.fromhex(answer.json()["key"])
                break
        note("copy_key_served", key is not None)
        if key is not None:
            self.keys.hold(self.job_id, 1, me.address, key)

    # -- round 1: the colluding scorer, the last revealer; then the hijack

    def round_one_scorer(self, me: HostileMember) -> None:
        note = self.report.note
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
        # Other scores than committed: refused as early (RevealNotOpen) whether or not the
        # commitments are all in by the time it is mined (then CommitmentMismatch), never taken.
        # The refusal is named on the block the commit count is read on: an honest commit landing
        # between the two reads would otherwise pair a count of 2 with a reveal already open (CI).
        at = int(me.w3.eth.block_number)
        committed = int(me.job_state(self.job_id, at_block=at)["commitCount"])
        tailored = {partner: JUNK_SCORE - 1}
        early = attempt(
            me,
            "FederatedLearning",
            "revealScores",
            at_block=at,
            **me.reveal_args(self.job_id, 1, tailored, base, salt),
        )
        note("reveal_before_all_committed", dict(early, commits_then=committed))
        # A job with DP: a reveal of scores needs the member's score release recorded first.
        if int(state["maxSpendPerRound"]):
            note("score_spend", {"status": int(me.spend(self.job_id, 1, 1, kind=1)["status"])})
        # The honest members reveal once every member committed (the last to commit in the same
        # transaction); this one reveals last, so its reveal finalizes the round.
        wait_for(
            lambda: (
                len(self.log.members("ScoresSubmitted", 1) & self.honest) >= 2
                or time.time() > int(self._state(me)["scoreDeadline"]) - 5
            ),
            self.timeout_s,
            "both honest reveals",
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
        predicted = predicted_next_committee(me, self.log, 1, salt)
        note("predicted_next_committee", predicted)
        hostile = {m.address.lower(): m for m in self.pair}
        hijacker = next((hostile[a] for a in predicted if a in hostile), None)
        # What the hijack's aggregate reads, read now: the honest nodes release no key while they
        # cannot see the chain (a key goes out once the chain says the training is over).
        models = self.models(me)
        models.base(1)
        for update in self.log.events("UpdateSubmitted", 1):
            models.update(1, update)
        with dark(self.proxy):
            # No honest node can act until the hijack vote is in: it is the round's first vote.
            receipt = me.reveal_scores(self.job_id, 1, scores, base, salt)
            note("reveal", {"status": int(receipt["status"]), "scores": scores, "base": base})
            finalized = self._finalized(1)
            drawn = lower(finalized.args["nextCommittee"]) if finalized is not None else []
            note("round1_next_committee", drawn)
            if hijacker is None or hijacker.address.lower() not in drawn:
                note("hijack", {"sent": False, "why": "the draw seated no hostile key to aggregate round 1"})
            else:
                data = models.expected(1)
                model_hash = bytes.fromhex(content_hash(data))
                receipt = hijacker.vote_model(self.job_id, 1, self.bomb_root, model_hash)
                note(
                    "hijack",
                    {
                        "sent": True,
                        "by": hijacker.address.lower(),
                        "status": int(receipt["status"]),
                        "block": int(receipt.get("blockNumber") or 0),
                        "model_hash": hex_of(model_hash),
                        "reference": hex_of(self.bomb_root),
                        "honest_reference": hex_of(blob_chunks(data)[0]),
                    },
                )
        if finalized is not None:
            for member in self.pair:
                if member.address.lower() in drawn and member is not hijacker:
                    self.report.seat(1, "aggregate", member.address, "silent: never votes")
