// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import "./Errors.sol";

/// @notice A job's specification, as proposed (FederatedLearning.proposeJob).
struct JobSpec {
    bytes32 configHash;
    bytes initialModelRef; // swarm reference: 32 bytes, or 64 for an encrypted one
    bytes32 initialModelHash;
    uint16 rounds;
    uint8 committeeSize;
    uint8 topK;
    uint16 minTrainers;
    bool useBlocks;
    uint64 joinDeadline; // absolute: timestamp, or block number with useBlocks
    uint32 trainPeriod; // per round: updates are due trainPeriod after the round opens
    uint32 scorePeriod; // scores are due scorePeriod after the update deadline
    uint64 maxSpendPerRound; // micro-epsilon a participant may record per release; 0: no DP
    uint16 margin; // basis points an update's median must beat the base model's median by
}

/// @notice Every event of FederatedLearning (RoundLogic emits some of them in its storage context).
interface IFederatedLearningEvents {
    event JobProposed(uint256 indexed jobId, address indexed proposer, JobSpec spec);
    event ParticipantJoined(uint256 indexed jobId, address indexed node, uint256 datasetId, uint16 index);
    /// The proposer closed the joins: each participant reveals its draw secret by `deadline`.
    event DrawOpened(uint256 indexed jobId, uint64 deadline);
    event DrawSecretRevealed(uint256 indexed jobId, address indexed node, uint16 revealed);
    /// The first committee: the drawn participants with the smallest keccak256(abi.encode(seed, 1, address)).
    event JobStarted(uint256 indexed jobId, address[] committee, bytes32 seed);
    event RoundOpened(
        uint256 indexed jobId,
        uint16 indexed round,
        address[] committee,
        bytes32 modelHash,
        uint64 updateDeadline,
        uint64 scoreDeadline
    );
    event UpdateSubmitted(
        uint256 indexed jobId,
        uint16 indexed round,
        address indexed trainer,
        uint16 index,
        bytes modelRef,
        bytes32 contentHash,
        uint64 samples
    );
    event ScoresCommitted(uint256 indexed jobId, uint16 indexed round, address indexed member, bytes32 commitment);
    event ScoresSubmitted(
        uint256 indexed jobId,
        uint16 indexed round,
        address indexed member,
        address[] trainers,
        uint16[] scores,
        uint16 baseScore
    );
    /// A member committed to scores and did not reveal them: it sits on no later committee of the job.
    event ScoresWithheld(uint256 indexed jobId, uint16 indexed round, address indexed member);
    /// `trainers` in submission order with their `medians`; `accepted` best first (ties by
    /// keccak256(abi.encode(seed, 0, trainer))); `nextCommittee` drawn with `seed`.
    event RoundFinalized(
        uint256 indexed jobId,
        uint16 indexed round,
        address[] trainers,
        uint16[] medians,
        address[] accepted,
        address[] nextCommittee,
        uint16 baseMedian,
        uint16 margin,
        uint64 aggregateDeadline,
        bytes32 seed
    );
    event GlobalModelVoted(
        uint256 indexed jobId,
        uint16 indexed round,
        address indexed member,
        bytes modelRef,
        bytes32 modelHash,
        uint8 votes,
        uint8 needed
    );
    event GlobalModelFixed(
        uint256 indexed jobId, uint16 indexed round, bytes32 modelHash, bytes32 referenceDigest, address proposer
    );
    /// The aggregation deadline passed without a fixed model: the round keeps the previous model
    /// and the next round opens with a committee drawn afresh (`committee`, drawn with `seed`).
    event AggregationSkipped(
        uint256 indexed jobId, uint16 indexed round, bytes32 modelHash, address[] committee, bytes32 seed
    );
    event JobFinished(uint256 indexed jobId, bytes32 modelHash, bytes32 referenceDigest);
    event JobFailed(uint256 indexed jobId, uint16 indexed round, uint16 updates, uint16 minTrainers);
    event JobCancelled(uint256 indexed jobId, uint16 round);
}

/// @title FederatedLearningState: the storage layout, bounds and shared steps of FederatedLearning.
/// @notice FederatedLearning and RoundLogic both derive from it, so that RoundLogic's code, run by
/// DELEGATECALL from FederatedLearning, reads and writes FederatedLearning's storage with the same
/// layout. Neither contract declares a state variable of its own (immutables live in code).
abstract contract FederatedLearningState is IFederatedLearningEvents {
    uint16 public constant PROTOCOL_VERSION = 2;
    uint256 public constant MAX_PARTICIPANTS = 200;
    // 15 seats of 16 bits under a 16-bit round tag fill one score slot (see _scores)
    uint256 public constant MAX_COMMITTEE = 15;
    uint256 public constant MAX_SCORE = 10_000;
    uint256 public constant MAX_ROUNDS = 10_000;
    uint256 public constant MAX_PERIOD = 7 days; // trainPeriod, scorePeriod (seconds or blocks)
    // joinDeadline - now (seconds or blocks): the API allows 30 days from the clock; a day of slack
    // for a chain whose latest timestamp lags that clock.
    uint256 public constant MAX_JOIN_WINDOW = 31 days;
    uint64 public constant MAX_SPEND_PER_ROUND = 100_000_000; // DataRegistry.MAX_PRIVACY_CAP
    // an update (or scores), a withheld speculative update, and one attempt lost to a crash
    uint8 public constant MAX_SPENDS_PER_ROUND = 3;
    uint8 public constant SPEND_SCORES = 1; // DataRegistry's kinds: 0 update, 1 scores, 2 withheld

    enum Status {
        None,
        Open,
        Running,
        Finished,
        Cancelled,
        Failed,
        Drawing // started: waiting for the draw secrets that seat the first committee
    }

    enum Phase {
        Training,
        Aggregating
    }

    struct Job {
        address proposer;
        uint16 rounds;
        uint16 round; // current round, 1-based; 0 before the start
        uint8 committeeSize;
        uint8 topK;
        uint16 minTrainers;
        Status status;
        Phase phase;
        bool useBlocks;
        uint64 joinDeadline;
        uint32 trainPeriod;
        uint32 scorePeriod;
        uint64 updateDeadline; // while Drawing: the reveal deadline
        uint64 scoreDeadline; // while Aggregating: the aggregation deadline
        uint16 participantCount;
        uint16 updateCount;
        uint8 scoreCount; // members that revealed their scores this round
        uint8 commitCount; // members that committed to scores this round
        uint64 maxSpendPerRound; // in the slot of updateCount: submitUpdate reads it warm
        uint16 margin; // accepted iff median > base median + margin (basis points)
        uint16 revealCount; // participants that revealed their draw secret
        uint16 earlyCount; // updates of the next round sent while this one aggregates
        bytes32 configHash;
        bytes32 modelHash; // the current global model
        bytes32 modelRefDigest; // keccak256 of its reference
        bytes32 seed; // the job's random state: every draw is derived from it
        bytes32 mix; // XOR of every draw secret and score salt revealed in the job so far (each draw hashes it with the previous seed)
    }

    struct Participant {
        bool joined;
        uint16 index;
        uint32 datasetId;
        uint16 updateRound; // last round with an update from this node
        uint16 updateIndex;
        uint16 scoreRound; // last round this node revealed scores for
        uint16 voteRound; // last round whose global model this node voted for
        uint16 committeeRound; // the round this node sits on the committee for
        uint8 seat;
        uint16 spendRound; // the last round this node recorded a privacy spend for
        uint8 spends; // spends recorded for spendRound
        uint40 samples; // the joined dataset's registered size: an update names at most this many
        uint16 commitRound; // the last round this node committed to scores for
        uint16 scoreSpendRound; // the last round this node recorded a score spend for
        uint8 flags; // DRAWN | PUBLIC_HOLDOUT
    }

    struct Vote {
        address proposer; // the first voter of the pair
        uint8 votes;
        bytes32 refDigest;
    }

    uint256 public jobCount;

    mapping(uint256 => Job) internal _jobs;
    mapping(uint256 => mapping(address => Participant)) internal _participants;
    mapping(uint256 => address[MAX_COMMITTEE]) internal _committee;
    // Per-round storage lives in slots that are reused round after round and made nonzero
    // outside the round (at join / proposeJob), so that a round's writes cost 2.9k
    // (nonzero -> nonzero) instead of 22.1k (zero -> nonzero) each:
    // job => update index => round << 160 | trainer (round tag EMPTY_TAG until the first update)
    mapping(uint256 => mapping(uint256 => uint256)) internal _updateAt;
    // job => update index => round << 240 | 15 seats x 16 bits (score + 1; 0 = no score); a slot
    // whose tag is not the round holds another round's scores and reads as none
    mapping(uint256 => mapping(uint256 => uint256)) internal _scores;
    // job => the committee's scores of the round's base model (the current global model), packed as above
    mapping(uint256 => uint256) internal _baseScores;
    // keccak(job, round, contentHash) => trainer: a content hash is submitted at most once per round
    mapping(bytes32 => address) internal _contentOwner;
    // job => participant index => flags << 160 | address (written at join): what a draw reads
    mapping(uint256 => mapping(uint256 => uint256)) internal _participantAt;
    // job => member => its score commitment (made nonzero at join, reused round after round; a
    // commitment names its round, so an old one never matches a reveal); before the start, its
    // draw commitment
    mapping(uint256 => mapping(address => bytes32)) internal _commitments;
    mapping(bytes32 => Vote) internal _votes; // keccak(job, round, modelHash, keccak(modelRef))

    uint256 internal constant EMPTY_TAG = 0xffff; // no valid round (MAX_ROUNDS < 0xffff)
    uint256 internal constant SCORE_BITS = 240; // 15 seats x 16 bits under the round tag
    uint256 internal constant SCORE_MASK = (uint256(1) << SCORE_BITS) - 1;
    uint8 internal constant DRAWN = 1; // revealed its draw secret: may train and sit
    uint8 internal constant PUBLIC_HOLDOUT = 2; // its dataset's hold-out is public: scores are free
    uint256 internal constant AT_DRAWN = uint256(1) << 160; // _participantAt flags
    uint256 internal constant AT_BANNED = uint256(1) << 161; // withheld a reveal: never seated again

    function _job(uint256 jobId) internal view returns (Job storage job) {
        job = _jobs[jobId];
        if (job.status == Status.None) revert UnknownJob(jobId);
    }

    /// The seat bits of a packed score slot if it holds `round`'s scores, else none.
    function _roundScores(uint256 slot, uint16 round) internal pure returns (uint256) {
        return slot >> SCORE_BITS == round ? slot & SCORE_MASK : 0;
    }

    /// The round's model is settled (fixed or kept): the next round opens, or the job finishes.
    function _nextRound(uint256 jobId, Job storage job, uint16 round, bytes32 modelHash, bytes32 refDigest) internal {
        if (round == job.rounds) {
            job.status = Status.Finished;
            emit JobFinished(jobId, modelHash, refDigest);
        } else {
            _openRound(jobId, job, round + 1);
        }
    }

    function _openRound(uint256 jobId, Job storage job, uint16 round) internal {
        uint64 current = _now(job);
        uint64 updateDeadline = current + job.trainPeriod;
        uint64 scoreDeadline = updateDeadline + job.scorePeriod;
        job.round = round;
        job.phase = Phase.Training;
        job.updateDeadline = updateDeadline;
        job.scoreDeadline = scoreDeadline;
        // updates sent early, while the previous round aggregated, are the round's first
        job.updateCount = job.earlyCount;
        job.earlyCount = 0;
        job.scoreCount = 0;
        job.commitCount = 0;
        address[] memory members = new address[](job.committeeSize);
        for (uint256 s; s < members.length; ++s) members[s] = _committee[jobId][s];
        emit RoundOpened(jobId, round, members, job.modelHash, updateDeadline, scoreDeadline);
    }

    function _requireReference(bytes calldata modelRef) internal pure {
        if (modelRef.length != 32 && modelRef.length != 64) revert InvalidReference(modelRef.length);
    }

    function _now(Job storage job) internal view returns (uint64) {
        return uint64(job.useBlocks ? block.number : block.timestamp);
    }
}
