"""One small class per contract over (address, client), its ABI loaded from the artifact.

Each method encodes its call without I/O (``ContractCall``) and hands it to the client;
results come back as dataclasses from ``resources``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

from eth_abi import encode
from eth_utils import keccak, to_checksum_address

from .abi import ContractCall, encode_call, functions_by_name
from .artifacts import load_artifact
from .client import ChainClient
from .resources import (
    DatasetInfo,
    JobSpec,
    JobState,
    JobStatus,
    NodeInfo,
    NodeStatus,
    ParticipantInfo,
    ProposalInfo,
    RoundPhase,
    RuleOutcome,
    TxReceipt,
    UpdateInfo,
)

ZERO32 = b"\x00" * 32

# A reveal can complete the committee's set and finalize the round in the same transaction when
# its gas estimate (against the pending block) said it would not: another member's reveal still
# in flight is mined first and makes this one the last. Sent with the estimate alone it then runs
# out of gas, and the member's scores are lost (one honest score fewer: with 2 of 3 left, a
# colluder's 10000 halves into a median of 5000). So a reveal carries room for the finalize:
# ~150k gas at 10 updates (bench/gas.py: reveal 153k, finalizing reveal 303k), the ranking's cost
# growing with the updates. Found by tests/adversarial/test_hostile_protocol.py.
FINALIZE_GAS_BASE = 150_000
FINALIZE_GAS_PER_UPDATE = 15_000


def finalize_headroom(updates: int) -> int:
    """Gas above a reveal's estimate: what finalizing a round of ``updates`` updates may add."""
    return FINALIZE_GAS_BASE + FINALIZE_GAS_PER_UPDATE * updates


class ContractBase:
    artifact_name: ClassVar[str]

    def __init__(self, address: str, client: ChainClient):
        self.address = to_checksum_address(address)
        self.client = client
        self.abi = load_artifact(self.artifact_name).abi
        self._functions = functions_by_name(self.abi)

    def encode(self, function: str, *args: Any) -> ContractCall:
        return encode_call(self.address, self._functions[function], args)

    def _call(self, function: str, *args: Any) -> tuple[Any, ...]:
        return self.client.call(self.encode(function, *args))

    def _transact(self, function: str, *args: Any) -> TxReceipt:
        return self.client.transact(self.encode(function, *args))


def _addresses(items: Sequence[str]) -> list[str]:
    return [to_checksum_address(a) for a in items]


class NodeRegistry(ContractBase):
    artifact_name = "NodeRegistry"

    def register_node(self, name: str, endpoint: str, pubkey: bytes, overlay: bytes) -> TxReceipt:
        return self._transact("registerNode", name, endpoint, pubkey, overlay)

    def vote_admission(self, applicant: str) -> TxReceipt:
        return self._transact("voteAdmission", to_checksum_address(applicant))

    def update_endpoint(self, endpoint: str) -> TxReceipt:
        return self._transact("updateEndpoint", endpoint)

    def leave(self) -> TxReceipt:
        return self._transact("leaveConsortium")

    def vote_removal(self, member: str) -> TxReceipt:
        return self._transact("voteRemoval", to_checksum_address(member))

    def is_member(self, account: str) -> bool:
        return self._call("isMember", to_checksum_address(account))[0]

    def member_count(self) -> int:
        return self._call("memberCount")[0]

    def members(self) -> list[str]:
        return _addresses(self._call("members")[0])

    def votes_needed(self) -> int:
        return self._call("votesNeeded")[0]

    def get_node(self, account: str) -> NodeInfo:
        name, endpoint, pubkey, overlay, status = self._call("getNode", to_checksum_address(account))
        return NodeInfo(to_checksum_address(account), name, endpoint, pubkey, overlay, NodeStatus(status))


class DataRegistry(ContractBase):
    artifact_name = "DataRegistry"

    def register_dataset(
        self,
        content_hash: bytes,
        swarm_ref: bytes,
        schema_hash: bytes,
        samples: int,
        privacy_cap: int,
        public_holdout_hash: bytes = ZERO32,
    ) -> int:
        """Register a dataset owned by this node; returns its id.

        ``privacy_cap`` in micro-epsilon (at most 100_000_000); ``public_holdout_hash``: the hash of
        a hold-out split declared public (scored without noise), zero bytes when none. A content
        hash already registered raises ``DuplicateDataset`` naming the existing id.
        """
        receipt = self.client.transact(
            self.register_call(
                content_hash, swarm_ref, schema_hash, samples, privacy_cap, public_holdout_hash
            )
        )
        return receipt.event("DatasetRegistered").args["datasetId"]

    def register_call(
        self,
        content_hash: bytes,
        swarm_ref: bytes,
        schema_hash: bytes,
        samples: int,
        privacy_cap: int,
        public_holdout_hash: bytes = ZERO32,
    ) -> ContractCall:
        """The encoded registerDataset call (for callers that want the whole receipt)."""
        return self.encode(
            "registerDataset", content_hash, swarm_ref, schema_hash, samples, privacy_cap, public_holdout_hash
        )

    def wire_spender(self, spender: str) -> TxReceipt:
        """Name the FederatedLearning contract that records spends (once, by the deployer)."""
        return self._transact("wireSpender", to_checksum_address(spender))

    def spender(self) -> str:
        return to_checksum_address(self._call("spender")[0])

    def dataset_by_content(self, content_hash: bytes) -> int:
        """The id of the dataset registered with this content hash (0 when none)."""
        return self._call("datasetByContent", content_hash)[0]

    def usable_samples(self, dataset_id: int, account: str) -> int:
        return self._call("usableSamples", dataset_id, to_checksum_address(account))[0]

    def grant(self, dataset_id: int, grantee: str, wrapped_key: bytes) -> TxReceipt:
        return self._transact("grant", dataset_id, to_checksum_address(grantee), wrapped_key)

    def revoke(self, dataset_id: int, grantee: str) -> TxReceipt:
        return self._transact("revoke", dataset_id, to_checksum_address(grantee))

    def can_use(self, dataset_id: int, account: str) -> bool:
        return self._call("canUse", dataset_id, to_checksum_address(account))[0]

    def is_granted(self, dataset_id: int, account: str) -> bool:
        return self._call("isGranted", dataset_id, to_checksum_address(account))[0]

    def privacy_spent_by_job(self, dataset_id: int, job_id: int) -> int:
        return self._call("privacySpentByJob", dataset_id, job_id)[0]

    def get_dataset(self, dataset_id: int) -> DatasetInfo:
        (owner, samples, cap, spent, content, schema, ref, holdout) = self._call("getDataset", dataset_id)[0]
        return DatasetInfo(
            dataset_id, to_checksum_address(owner), samples, cap, spent, content, schema, ref, holdout
        )


class FederatedLearning(ContractBase):
    artifact_name = "FederatedLearning"

    def propose_job(self, spec: JobSpec) -> int:
        """Propose a job; returns its id."""
        receipt = self._transact("proposeJob", spec.as_abi())
        return receipt.event("JobProposed").args["jobId"]

    def join(self, job_id: int, dataset_id: int) -> TxReceipt:
        return self._transact("join", job_id, dataset_id)

    def start_job(self, job_id: int) -> TxReceipt:
        """Start the job (its proposer only); the first committee is drawn on chain from the
        participants (JobStarted names it and the seed)."""
        return self._transact("startJob", job_id)

    def cancel(self, job_id: int) -> TxReceipt:
        return self._transact("cancel", job_id)

    def submit_update(
        self, job_id: int, round_: int, reference: bytes, content_hash: bytes, samples: int, spend: int = 0
    ) -> TxReceipt:
        """``spend``: this release's privacy spend (micro-epsilon), recorded in the same transaction
        as spend_privacy would; 0 when it was recorded already or the job has no DP. A content
        hash already submitted in the round raises DuplicateContent."""
        return self._transact("submitUpdate", job_id, round_, reference, content_hash, samples, spend)

    def spend_privacy(self, job_id: int, round_: int, micro_epsilon: int) -> TxReceipt:
        """Record one release of this node's data in ``round_`` of the job (the current round, or
        the next while the current one aggregates): 1..max_spend_per_round micro-epsilon, counted
        against the dataset this node joined with, at most twice per round."""
        return self._transact("spendPrivacy", job_id, round_, micro_epsilon)

    def commit_scores(
        self, job_id: int, round_: int, scores: dict[str, int], base_score: int, salt: bytes
    ) -> TxReceipt:
        """Commit to ``scores`` (see reveal_scores) with a secret 32-byte ``salt``; only the hash
        goes on chain."""
        digest = score_commitment(job_id, round_, self.client.address, scores, base_score, salt)
        return self._transact("commitScores", job_id, round_, digest)

    def reveal_scores(
        self, job_id: int, round_: int, scores: dict[str, int], base_score: int, salt: bytes
    ) -> TxReceipt:
        """Reveal the committed scores (0..10000) by trainer address, for some or all of the
        round's updates, and this member's score of the round's base model (the current global
        model): an update is accepted only when its median beats the base scores' median by the
        job's margin. Same order, values and salt as committed."""
        return self._send_scores("revealScores", job_id, round_, scores, base_score, salt)

    def commit_and_reveal_scores(
        self, job_id: int, round_: int, scores: dict[str, int], base_score: int
    ) -> TxReceipt:
        """The commitment that completes the committee's set, and its reveal, in one transaction
        (every other member is bound already); RevealNotOpen while another commitment is due."""
        return self._send_scores("commitAndRevealScores", job_id, round_, scores, base_score)

    def _send_scores(
        self, function: str, job_id: int, round_: int, scores: dict[str, int], *rest
    ) -> TxReceipt:
        """A call carrying scores by trainer (addresses and values in the dict's order), with gas
        room for the finalization it may complete."""
        trainers = list(scores)
        call = self.encode(
            function, job_id, round_, _addresses(trainers), [scores[t] for t in trainers], *rest
        )
        return self.client.transact(call, extra_gas=finalize_headroom(len(trainers)))

    def finalize_round(self, job_id: int, round_: int) -> TxReceipt:
        return self._transact("finalizeRound", job_id, round_)

    def propose_global_model(
        self, job_id: int, round_: int, reference: bytes, model_hash: bytes
    ) -> TxReceipt:
        return self._transact("proposeGlobalModel", job_id, round_, reference, model_hash)

    def confirm_global_model(
        self, job_id: int, round_: int, model_hash: bytes, reference: bytes
    ) -> TxReceipt:
        """Confirm the proposal of exactly this (model hash, reference) pair, both recomputed; a
        pair nobody proposed raises ProposalMismatch."""
        return self._transact("confirmGlobalModel", job_id, round_, model_hash, reference)

    def skip_aggregation(self, job_id: int, round_: int) -> TxReceipt:
        """After the round's aggregation deadline, with no model fixed: keep the previous model,
        draw a new committee and open the next round (anyone may send it)."""
        return self._transact("skipAggregation", job_id, round_)

    def job_count(self) -> int:
        return self._call("jobCount")[0]

    def get_job(self, job_id: int) -> JobState:
        values = list(self._call("getJob", job_id)[0])
        values[0] = to_checksum_address(values[0])
        state = JobState(job_id, *values)
        return _replace_enums(state)

    def committee(self, job_id: int) -> list[str]:
        return _addresses(self._call("committee", job_id)[0])

    def get_participant(self, job_id: int, node: str) -> ParticipantInfo:
        return ParticipantInfo(*self._call("getParticipant", job_id, to_checksum_address(node))[0])

    def get_update(self, job_id: int, round_: int, index: int) -> UpdateInfo:
        trainer, packed = self._call("getUpdate", job_id, round_, index)
        return UpdateInfo(to_checksum_address(trainer), packed)

    def get_base_scores(self, job_id: int, round_: int) -> dict[int, int]:
        """Seat -> the member's score of the round's base model."""
        return UpdateInfo("", self._call("getBaseScores", job_id, round_)[0]).scores_by_seat()

    def content_owner(self, job_id: int, round_: int, content_hash: bytes) -> str:
        """The trainer whose update of the round carries this content hash (zero address: none)."""
        return to_checksum_address(self._call("contentOwner", job_id, round_, content_hash)[0])

    def get_proposal(self, job_id: int, round_: int, model_hash: bytes, reference: bytes) -> ProposalInfo:
        proposer, votes, digest = self._call("getProposal", job_id, round_, model_hash, reference)[0]
        return ProposalInfo(to_checksum_address(proposer), votes, digest)

    def allow_small_committees(self) -> bool:
        """A development deployment: committees of 1, 2 or an even size are accepted."""
        return bool(self._call("allowSmallCommittees")[0])

    def quorum(self, committee_size: int) -> int:
        return self._call("quorum", committee_size)[0]


def _replace_enums(state: JobState) -> JobState:
    return replace(state, status=JobStatus(state.status), phase=RoundPhase(state.phase))


class CommitteeRuleHarness(ContractBase):
    """The committee rule as a pure function (tests and tools; eth_call only)."""

    artifact_name = "CommitteeRuleHarness"

    def decide(
        self,
        trainers: Sequence[str],
        packed_scores: Sequence[int],
        top_k: int,
        committee_size: int,
        current_committee: Sequence[str],
        base_scores: int = 0,
        margin: int = 0,
        tie_seed: bytes = bytes(32),
    ) -> RuleOutcome:
        """``base_scores``: the members' scores of the base model, packed as ``packed_scores``;
        ``tie_seed`` orders equal medians (keccak(tie_seed, trainer), smaller first)."""
        ranking, medians, accepted, next_committee, base_median = self._call(
            "decide",
            _addresses(trainers),
            list(packed_scores),
            top_k,
            committee_size,
            _addresses(current_committee),
            base_scores,
            margin,
            tie_seed,
        )[0]
        return RuleOutcome(
            _addresses(ranking),
            list(medians),
            _addresses(accepted),
            _addresses(next_committee),
            base_median,
        )


def score_commitment(
    job_id: int, round_: int, member: str, scores: dict[str, int], base_score: int, salt: bytes
) -> bytes:
    """keccak256(abi.encode(jobId, round, member, trainers, scores, baseScore, salt)), as
    FederatedLearning.revealScores checks it (trainers in the dict's order)."""
    trainers = list(scores)
    encoded = encode(
        ["uint256", "uint16", "address", "address[]", "uint16[]", "uint16", "bytes32"],
        [
            job_id,
            round_,
            to_checksum_address(member),
            _addresses(trainers),
            [scores[t] for t in trainers],
            base_score,
            salt,
        ],
    )
    return keccak(encoded)


def pack_scores(scores_by_seat: dict[int, int]) -> int:
    """Seat -> score (0..10000) as the contract packs them: 16 bits per seat, score + 1."""
    packed = 0
    for seat, score in scores_by_seat.items():
        packed |= (score + 1) << (16 * seat)
    return packed
