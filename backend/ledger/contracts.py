"""One small class per contract over (address, client), its ABI loaded from the artifact.

Each method encodes its call without I/O (``ContractCall``) and hands it to the client;
results come back as dataclasses from ``resources``.
"""

from __future__ import annotations

import hashlib
import hmac
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
    GrantInfo,
    JobSpec,
    JobState,
    JobStatus,
    NodeInfo,
    NodeStatus,
    ParticipantInfo,
    RoundPhase,
    RuleOutcome,
    SourceInfo,
    SpendKind,
    TxReceipt,
    UpdateInfo,
    VoteInfo,
)

ZERO32 = b"\x00" * 32

# A reveal can complete the committee's set and finalize the round in the same transaction when
# its gas estimate (against the pending block) said it would not: another member's reveal still
# in flight is mined first and makes this one the last. Sent with the estimate alone it then runs
# out of gas, and the member's scores are lost (one honest score fewer: with 2 of 3 left, a
# colluder's 10000 halves into a median of 5000). So a reveal carries room for the finalize:
# ~150k gas at 10 updates (bench/gas.py: reveal 153k, finalizing reveal 303k), the medians' and
# the draw's cost growing with the updates. Found by tests/adversarial/test_hostile_protocol.py.
FINALIZE_GAS_BASE = 150_000
FINALIZE_GAS_PER_UPDATE = 15_000
# Likewise a draw-secret reveal that completes the set draws the first committee: a keccak and a
# read per participant (about 5k gas each), at most MAX_PARTICIPANTS.
DRAW_GAS_BASE = 1_200_000


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

    # --- carrying a predecessor's members over (docs/OPERATIONS.md, Upgrades)

    def predecessor(self) -> str | None:
        """The previous NodeRegistry this one imports from; None for a fresh consortium."""
        address = self._call("predecessor")[0]
        return None if int(address, 16) == 0 else to_checksum_address(address)

    def import_open(self) -> bool:
        return self._call("importOpen")[0]

    def data_import(self) -> str | None:
        """The DataRegistry whose import closes with this one's (None: not wired yet)."""
        address = self._call("dataImport")[0]
        return None if int(address, 16) == 0 else to_checksum_address(address)

    def threshold_percent(self) -> int:
        return self._call("thresholdPercent")[0]

    def members_complete(self) -> bool:
        return self._call("membersComplete")[0]

    def wire_data_import(self, data_registry: str) -> TxReceipt:
        return self._transact("wireDataImport", to_checksum_address(data_registry))

    def import_members(self, accounts: Sequence[str]) -> TxReceipt:
        return self._transact("importMembers", _addresses(accounts))

    def confirm_import(self) -> TxReceipt:
        return self._transact("confirmImport")


class DataRegistry(ContractBase):
    artifact_name = "DataRegistry"

    def register_dataset(
        self,
        commitment: bytes,
        swarm_ref: bytes,
        schema_hash: bytes,
        samples: int,
        privacy_cap: int,
        public_holdout_hash: bytes = ZERO32,
        disjoint: bool = False,
        *,
        initial_spend: int = 0,
    ) -> int:
        """Register a dataset owned by this node; returns its id.

        ``commitment``: a commitment to the records keyed by a secret of this node (never an
        unkeyed hash of them); ``privacy_cap`` in micro-epsilon (at most 100_000_000);
        ``public_holdout_hash``: the (keyed) hash of a hold-out split declared public (scored without
        noise), zero bytes when none; ``disjoint``: the provider declares it shares no record with its
        other datasets (a budget source of its own), else it shares the provider's one;
        ``initial_spend``: the micro-epsilon of the release the registration makes (``samples`` a DP
        count of the records), counted into the source's spend and recorded in DatasetRegistered
        (``InvalidDataset`` "initialSpend" past the source's cap); 0 for none. A commitment already
        registered raises ``DuplicateDataset`` naming the existing id.
        """
        receipt = self.client.transact(
            self.register_call(
                commitment,
                swarm_ref,
                schema_hash,
                samples,
                privacy_cap,
                public_holdout_hash,
                disjoint,
                initial_spend=initial_spend,
            )
        )
        return receipt.event("DatasetRegistered").args["datasetId"]

    def register_call(
        self,
        commitment: bytes,
        swarm_ref: bytes,
        schema_hash: bytes,
        samples: int,
        privacy_cap: int,
        public_holdout_hash: bytes = ZERO32,
        disjoint: bool = False,
        *,
        initial_spend: int = 0,
    ) -> ContractCall:
        """The encoded registerDataset call (for callers that want the whole receipt)."""
        return self.encode(
            "registerDataset",
            commitment,
            swarm_ref,
            schema_hash,
            samples,
            privacy_cap,
            public_holdout_hash,
            disjoint,
            initial_spend,
        )

    # --- carrying a predecessor's datasets over (docs/OPERATIONS.md, Upgrades)

    def predecessor(self) -> str | None:
        """The previous DataRegistry this one imports from; None for a fresh consortium."""
        address = self._call("predecessor")[0]
        return None if int(address, 16) == 0 else to_checksum_address(address)

    def registry(self) -> str:
        return to_checksum_address(self._call("registry")[0])

    def dataset_count(self) -> int:
        return self._call("datasetCount")[0]

    def imported_count(self) -> int:
        return self._call("importedCount")[0]

    def import_complete(self) -> bool:
        return self._call("importComplete")[0]

    def import_datasets(self, from_id: int, to_id: int) -> TxReceipt:
        """Copy the predecessor's datasets from_id..to_id (inclusive), keeping their ids."""
        return self._transact("importDatasets", from_id, to_id)

    def sync_spent(self, dataset_id: int) -> TxReceipt:
        """Count what the predecessor's jobs spent on an imported dataset since its import."""
        return self._transact("syncSpent", dataset_id)

    def wire_spender(self, spender: str) -> TxReceipt:
        """Name the FederatedLearning contract that records spends (once, by the deployer)."""
        return self._transact("wireSpender", to_checksum_address(spender))

    def spender(self) -> str:
        return to_checksum_address(self._call("spender")[0])

    def dataset_by_commitment(self, commitment: bytes) -> int:
        """The id of the dataset registered with this commitment (0 when none)."""
        return self._call("datasetByCommitment", commitment)[0]

    def usage(self, dataset_id: int, account: str) -> tuple[int, bool]:
        """(registered samples, public hold-out?) if ``account`` may use the dataset, else (0, False)."""
        samples, public = self._call("usage", dataset_id, to_checksum_address(account))
        return samples, public

    def usable_samples(self, dataset_id: int, account: str) -> int:
        return self.usage(dataset_id, account)[0]

    def grant(self, dataset_id: int, grantee: str, wrapped_key: bytes, cap: int) -> TxReceipt:
        """Give ``grantee`` the wrapped data key and a cap (micro-epsilon) on what its jobs may
        spend from the dataset; again for an active grantee: a re-wrapped key (after rotate_key)."""
        return self._transact("grant", dataset_id, to_checksum_address(grantee), wrapped_key, cap)

    def revoke(self, dataset_id: int, grantee: str) -> TxReceipt:
        """End a grant: the grantee's later spends on the dataset revert (GrantRevoked)."""
        return self._transact("revoke", dataset_id, to_checksum_address(grantee))

    def rotate_key(self, dataset_id: int, swarm_ref: bytes) -> TxReceipt:
        """The dataset re-encrypted under a fresh key: its new root reference (owner only)."""
        return self._transact("rotateKey", dataset_id, swarm_ref)

    def can_use(self, dataset_id: int, account: str) -> bool:
        return self._call("canUse", dataset_id, to_checksum_address(account))[0]

    def is_granted(self, dataset_id: int, account: str) -> bool:
        return self._call("isGranted", dataset_id, to_checksum_address(account))[0]

    def get_grant(self, dataset_id: int, grantee: str) -> GrantInfo:
        active, cap, spent = self._call("getGrant", dataset_id, to_checksum_address(grantee))[0]
        return GrantInfo(active, cap, spent)

    def privacy_spent_by_job(self, dataset_id: int, job_id: int) -> int:
        return self._call("privacySpentByJob", dataset_id, job_id)[0]

    def get_dataset(self, dataset_id: int) -> DatasetInfo:
        (owner, samples, source, cap, commitment, schema, ref, holdout) = self._call(
            "getDataset", dataset_id
        )[0]
        return DatasetInfo(
            dataset_id, to_checksum_address(owner), samples, source, cap, commitment, schema, ref, holdout
        )

    def source_of(self, dataset_id: int) -> int:
        return self._call("sourceOf", dataset_id)[0]

    def get_source(self, source_id: int) -> SourceInfo:
        owner, cap, spent = self._call("getSource", source_id)[0]
        return SourceInfo(source_id, to_checksum_address(owner), cap, spent)


class FederatedLearning(ContractBase):
    artifact_name = "FederatedLearning"

    def propose_job(self, spec: JobSpec) -> int:
        """Propose a job; returns its id."""
        receipt = self._transact("proposeJob", spec.as_abi())
        return receipt.event("JobProposed").args["jobId"]

    def draw_secret(self, job_id: int) -> bytes:
        """This node's draw secret for a job: HMAC-SHA256 under its key of (chain, contract, job), so
        nobody else can know it before it is revealed, and the node recomputes it after a restart or
        a restore from its keystore instead of keeping it anywhere."""
        label = b"defl-draw-secret" + encode(
            ["uint256", "address", "uint256"], [self.client.chain_id, self.address, job_id]
        )
        return hmac.new(bytes(self.client.account.key), label, hashlib.sha256).digest()

    def join(self, job_id: int, dataset_id: int, draw_secret: bytes | None = None) -> TxReceipt:
        """Join with a dataset, committing to a draw secret (this node's own by default), revealed
        when the job starts (reveal_draw_secret); only its commitment goes on chain."""
        secret = self.draw_secret(job_id) if draw_secret is None else draw_secret
        return self._transact(
            "join", job_id, dataset_id, draw_commitment(job_id, self.client.address, secret)
        )

    def start_job(self, job_id: int) -> TxReceipt:
        """Close the joins (the proposer only): the participants then reveal their draw secrets,
        and the first committee is drawn from them (JobStarted names it and the seed)."""
        return self._transact("startJob", job_id)

    def reveal_draw_secret(self, job_id: int, secret: bytes | None = None) -> TxReceipt:
        """Reveal the secret committed at join (this node's own by default); the reveal that
        completes the set draws the first committee (room for that draw is added to the estimate)."""
        call = self.encode("revealDrawSecret", job_id, self.draw_secret(job_id) if secret is None else secret)
        return self.client.transact(call, extra_gas=DRAW_GAS_BASE)

    def draw_committee(self, job_id: int) -> TxReceipt:
        """After the reveal deadline: draw the first committee from the participants that revealed."""
        return self._transact("drawCommittee", job_id)

    def cancel(self, job_id: int) -> TxReceipt:
        return self._transact("cancel", job_id)

    def submit_update(
        self, job_id: int, round_: int, reference: bytes, content_hash: bytes, samples: int, spend: int = 0
    ) -> TxReceipt:
        """``spend``: this release's privacy spend (micro-epsilon), recorded in the same transaction
        as spend_privacy would (kind UPDATE); 0 when it was recorded already or the job has no DP.
        A content hash already submitted in the round raises DuplicateContent."""
        return self._transact("submitUpdate", job_id, round_, reference, content_hash, samples, spend)

    def spend_privacy(
        self, job_id: int, round_: int, micro_epsilon: int, kind: SpendKind, steps: int = 0
    ) -> TxReceipt:
        """Record one release of this node's data in ``round_`` of the job (the current round, or
        the next while the current one aggregates): 1..max_spend_per_round micro-epsilon, counted
        against the budget source of the dataset this node joined with (and its grant), at most
        MAX_SPENDS_PER_ROUND per round. ``steps``: a training release's local steps."""
        return self._transact("spendPrivacy", job_id, round_, micro_epsilon, int(kind), steps)

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
        job's margin. Same order, values and salt as committed; the salt enters the job's draws."""
        return self._send_scores("revealScores", job_id, round_, scores, base_score, salt)

    def commit_and_reveal_scores(
        self, job_id: int, round_: int, scores: dict[str, int], base_score: int, salt: bytes
    ) -> TxReceipt:
        """The commitment that completes the committee's set, and its reveal, in one transaction
        (every other member is bound already); RevealNotOpen while another commitment is due."""
        return self._send_scores("commitAndRevealScores", job_id, round_, scores, base_score, salt)

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

    def vote_global_model(self, job_id: int, round_: int, reference: bytes, model_hash: bytes) -> TxReceipt:
        """Vote for the (model hash, reference) pair this member recomputed; the first vote for a
        pair creates it, a majority of the committee for one pair fixes it and opens the next round."""
        return self._transact("voteGlobalModel", job_id, round_, reference, model_hash)

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

    def is_banned(self, job_id: int, node: str) -> bool:
        """It withheld a reveal of scores it committed to: it sits on no later committee of the job."""
        return bool(self._call("isBanned", job_id, to_checksum_address(node))[0])

    def get_update(self, job_id: int, round_: int, index: int) -> UpdateInfo:
        trainer, packed = self._call("getUpdate", job_id, round_, index)
        return UpdateInfo(to_checksum_address(trainer), packed)

    def get_base_scores(self, job_id: int, round_: int) -> dict[int, int]:
        """Seat -> the member's score of the round's base model."""
        return UpdateInfo("", self._call("getBaseScores", job_id, round_)[0]).scores_by_seat()

    def content_owner(self, job_id: int, round_: int, content_hash: bytes) -> str:
        """The trainer whose update of the round carries this content hash (zero address: none)."""
        return to_checksum_address(self._call("contentOwner", job_id, round_, content_hash)[0])

    def get_vote(self, job_id: int, round_: int, model_hash: bytes, reference: bytes) -> VoteInfo:
        proposer, votes, digest = self._call("getVote", job_id, round_, model_hash, reference)[0]
        return VoteInfo(to_checksum_address(proposer), votes, digest)

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
        base_scores: int = 0,
        margin: int = 0,
        seed: bytes = bytes(32),
    ) -> RuleOutcome:
        """``base_scores``: the members' scores of the base model, packed as ``packed_scores``;
        ``seed`` orders equal medians (keccak(seed, 0, trainer), smaller first)."""
        medians, accepted, base_median = self._call(
            "decide",
            _addresses(trainers),
            list(packed_scores),
            top_k,
            committee_size,
            base_scores,
            margin,
            seed,
        )
        return RuleOutcome(list(medians), _addresses(accepted), base_median)


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


def draw_commitment(job_id: int, participant: str, secret: bytes) -> bytes:
    """keccak256(abi.encode(jobId, participant, secret)): what join commits to."""
    return keccak(
        encode(["uint256", "address", "bytes32"], [job_id, to_checksum_address(participant), secret])
    )


def pack_scores(scores_by_seat: dict[int, int]) -> int:
    """Seat -> score (0..10000) as the contract packs them: 16 bits per seat, score + 1."""
    packed = 0
    for seat, score in scores_by_seat.items():
        packed |= (score + 1) << (16 * seat)
    return packed
