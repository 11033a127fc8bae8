// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import "./Errors.sol";
import {INodeRegistry, IDataRegistry} from "./INodeRegistry.sol";
import {CommitteeRule} from "./CommitteeRule.sol";

/// @title FederatedLearning: jobs, rounds and committee consensus (BFLC) for DeFL.
/// @notice Round r of a running job: participants outside the round's committee submit one update
/// each (`submitUpdate`); committee members score the updates once the updates are all in or the
/// training deadline passed, by commit and reveal: each member commits to its scores
/// (`commitScores`, a hash with a secret salt) by the commit deadline (half the score period), and
/// reveals them (`revealScores`) once every member committed or the commit deadline passed, so no
/// member sees another's scores before it is bound to its own. The reveal that completes the set
/// of committed members (after the commit deadline, or when the whole committee committed)
/// finalizes the round in the same transaction; a member that committed but does not reveal by the
/// score deadline counts as absent, and anyone then finalizes (`finalizeRound`) with the reveals in. Finalizing applies CommitteeRule: accepted set and the next committee (or fails the job
/// when fewer than minTrainers updates arrived). The next committee aggregates off-chain; one
/// member proposes the round's global model (`proposeGlobalModel`), the others confirm it
/// (`confirmGlobalModel`); a majority of the committee (committeeSize / 2 + 1 votes, the
/// proposer's included) fixes it and opens round r + 1 (or finishes the job after the last round).
/// Deadlines are in seconds (block.timestamp) or, with `useBlocks`, in blocks. Only references,
/// hashes, scores and membership are stored or emitted.
///
/// Privacy: a job's spec plans `maxSpendPerRound` (micro-epsilon, 1_000_000 = epsilon 1.0; 0 for
/// a job without DP). A participant records each release of its data (a trained update, a DP
/// committee score) with `spendPrivacy(jobId, round, amount)`: the spend counts against the
/// dataset it joined with (DataRegistry refuses one past the dataset's cap), is at most the
/// planned bound, and at most MAX_SPENDS_PER_ROUND per participant and round (a committee
/// member's score release; a trainer's update plus one retrain after a discarded speculative
/// update). In a job with DP, `submitUpdate` requires the trainer's spend for that round.
///
/// Committee: the first one is drawn on chain at `startJob` from the job's participants (see
/// `_drawCommittee`), never chosen by the proposer. Its size is odd and at least 3, so that a
/// single member can neither fix a model nor carry a score's median, unless the deployment was
/// made for development with `allowSmallCommittees` (an immutable constructor flag).
///
/// Proposals bind the model hash AND its swarm reference: a confirmation names both, and counts
/// only toward the proposal with that pair, so a member that proposes the right hash with a bogus
/// (or oversized) reference gets no honest vote; honest members propose the right pair instead.
///
/// Bounds: every value this contract accepts is bounded as the job configuration bounds it
/// (backend/jobs/config.py, serializers.py), so the mirrors of all nodes can store it.
contract FederatedLearning {
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
    uint8 public constant MAX_SPENDS_PER_ROUND = 2;

    enum Status {
        None,
        Open,
        Running,
        Finished,
        Cancelled,
        Failed
    }

    enum Phase {
        Training,
        Aggregating
    }

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
        uint64 updateDeadline;
        uint64 scoreDeadline;
        uint16 participantCount;
        uint16 updateCount;
        uint8 scoreCount; // members that revealed their scores this round
        uint8 commitCount; // members that committed to scores this round
        uint64 maxSpendPerRound; // in the slot of updateCount: submitUpdate reads it warm
        uint16 margin; // accepted iff median > base median + margin (basis points)
        bytes32 configHash;
        bytes32 modelHash; // the current global model
        bytes32 modelRefDigest; // keccak256 of its reference
    }

    struct Participant {
        bool joined;
        uint16 index;
        uint64 datasetId;
        uint16 updateRound; // last round with an update from this node
        uint16 updateIndex;
        uint16 scoreRound; // last round this node scored
        uint16 voteRound; // last round whose global model this node proposed or confirmed
        uint16 committeeRound; // the round this node sits on the committee for
        uint8 seat;
        uint16 spendRound; // the last round this node recorded a privacy spend for
        uint8 spends; // spends recorded for spendRound
        uint40 samples; // the joined dataset's registered size: an update names at most this many
        uint16 commitRound; // the last round this node committed to scores for
    }

    struct Proposal {
        address proposer;
        uint8 votes;
        bytes32 refDigest;
    }

    INodeRegistry public immutable registry;
    IDataRegistry public immutable dataRegistry;
    /// Development deployments only: committees of 1, 2 or any even size are accepted.
    bool public immutable allowSmallCommittees;
    uint256 public jobCount;

    mapping(uint256 => Job) private _jobs;
    mapping(uint256 => mapping(address => Participant)) private _participants;
    mapping(uint256 => address[MAX_COMMITTEE]) private _committee;
    // Per-round storage lives in slots that are reused round after round and made nonzero
    // outside the round (at join / proposeJob), so that a round's writes cost 2.9k
    // (nonzero -> nonzero) instead of 22.1k (zero -> nonzero) each:
    // job => update index => round << 160 | trainer (round tag EMPTY_TAG until the first update)
    mapping(uint256 => mapping(uint256 => uint256)) private _updateAt;
    // job => update index => round << 240 | 15 seats x 16 bits (score + 1; 0 = no score); a slot
    // whose tag is not the round holds another round's scores and reads as none
    mapping(uint256 => mapping(uint256 => uint256)) private _scores;
    // job => the committee's scores of the round's base model (the current global model), packed as above
    mapping(uint256 => uint256) private _baseScores;
    // keccak(job, round, contentHash) => trainer: a content hash is submitted at most once per round
    mapping(bytes32 => address) private _contentOwner;
    // job => participant index => address (written at join): a committee redraw enumerates them
    mapping(uint256 => mapping(uint256 => address)) private _participantAt;
    // job => member => its score commitment (made nonzero at join, reused round after round; a
    // commitment names its round, so an old one never matches a reveal)
    mapping(uint256 => mapping(address => bytes32)) private _commitments;
    mapping(bytes32 => Proposal) private _proposals; // keccak(job, round, modelHash, keccak(modelRef))

    uint256 private constant EMPTY_TAG = 0xffff; // no valid round (MAX_ROUNDS < 0xffff)
    uint256 private constant SCORE_BITS = 240; // 15 seats x 16 bits under the round tag
    uint256 private constant SCORE_MASK = (uint256(1) << SCORE_BITS) - 1;

    event JobProposed(uint256 indexed jobId, address indexed proposer, JobSpec spec);
    event ParticipantJoined(uint256 indexed jobId, address indexed node, uint256 datasetId, uint16 index);
    /// The first committee: the participants with the smallest keccak256(abi.encode(seed, address)).
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
    event RoundFinalized(
        uint256 indexed jobId,
        uint16 indexed round,
        address[] ranking,
        uint16[] medians,
        address[] accepted,
        address[] nextCommittee,
        uint16 baseMedian,
        uint16 margin,
        uint64 aggregateDeadline,
        bytes32 tieSeed
    );
    event GlobalModelProposed(
        uint256 indexed jobId, uint16 indexed round, address indexed proposer, bytes modelRef, bytes32 modelHash
    );
    event GlobalModelConfirmed(
        uint256 indexed jobId,
        uint16 indexed round,
        address indexed member,
        bytes32 modelHash,
        bytes32 referenceDigest,
        uint8 votes,
        uint8 needed
    );
    event GlobalModelFixed(
        uint256 indexed jobId, uint16 indexed round, bytes32 modelHash, bytes32 referenceDigest, address proposer
    );
    /// The aggregation deadline passed without a fixed model: the round keeps the previous model
    /// and the next round opens with a committee drawn afresh (`committee`, the participants with the
    /// smallest keccak256(abi.encode(seed, address))).
    event AggregationSkipped(
        uint256 indexed jobId, uint16 indexed round, bytes32 modelHash, address[] committee, bytes32 seed
    );
    event JobFinished(uint256 indexed jobId, bytes32 modelHash, bytes32 referenceDigest);
    event JobFailed(uint256 indexed jobId, uint16 indexed round, uint16 updates, uint16 minTrainers);
    event JobCancelled(uint256 indexed jobId, uint16 round);

    constructor(INodeRegistry registry_, IDataRegistry dataRegistry_, bool allowSmallCommittees_) {
        registry = registry_;
        dataRegistry = dataRegistry_;
        allowSmallCommittees = allowSmallCommittees_;
    }

    // ------------------------------------------------------------------ jobs

    function proposeJob(JobSpec calldata spec) external returns (uint256 jobId) {
        _requireMember();
        if (spec.configHash == bytes32(0)) revert InvalidJobSpec("configHash");
        _requireReference(spec.initialModelRef);
        if (spec.initialModelHash == bytes32(0)) revert InvalidJobSpec("initialModelHash");
        if (spec.rounds == 0 || spec.rounds > MAX_ROUNDS) revert InvalidJobSpec("rounds");
        if (spec.committeeSize == 0 || spec.committeeSize > MAX_COMMITTEE) revert InvalidJobSpec("committeeSize");
        // One member of a committee of 1 or 2 fixes models and carries medians alone; an even
        // committee splits its votes. Small ones only on a development deployment.
        if (!allowSmallCommittees && (spec.committeeSize < 3 || spec.committeeSize % 2 == 0)) {
            revert InvalidJobSpec("committeeSize must be odd and at least 3");
        }
        if (spec.topK == 0) revert InvalidJobSpec("topK");
        if (spec.minTrainers == 0 || uint256(spec.minTrainers) + spec.committeeSize > MAX_PARTICIPANTS) {
            revert InvalidJobSpec("minTrainers");
        }
        if (spec.trainPeriod == 0 || spec.scorePeriod == 0) revert InvalidJobSpec("period");
        if (spec.trainPeriod > MAX_PERIOD || spec.scorePeriod > MAX_PERIOD) revert InvalidJobSpec("period");
        uint256 current = spec.useBlocks ? block.number : block.timestamp;
        if (spec.joinDeadline <= current || spec.joinDeadline > current + MAX_JOIN_WINDOW) {
            revert InvalidJobSpec("joinDeadline");
        }
        if (spec.maxSpendPerRound > MAX_SPEND_PER_ROUND) revert InvalidJobSpec("maxSpendPerRound");
        if (spec.margin > MAX_SCORE) revert InvalidJobSpec("margin");
        jobId = ++jobCount;
        Job storage job = _jobs[jobId];
        job.proposer = msg.sender;
        job.rounds = spec.rounds;
        job.committeeSize = spec.committeeSize;
        job.topK = spec.topK;
        job.minTrainers = spec.minTrainers;
        job.status = Status.Open;
        job.useBlocks = spec.useBlocks;
        job.joinDeadline = spec.joinDeadline;
        job.trainPeriod = spec.trainPeriod;
        job.scorePeriod = spec.scorePeriod;
        job.maxSpendPerRound = spec.maxSpendPerRound;
        job.margin = spec.margin;
        _baseScores[jobId] = EMPTY_TAG << SCORE_BITS;
        job.configHash = spec.configHash;
        job.modelHash = spec.initialModelHash;
        job.modelRefDigest = keccak256(spec.initialModelRef);
        emit JobProposed(jobId, msg.sender, spec);
    }

    function join(uint256 jobId, uint256 datasetId) external {
        Job storage job = _open(jobId);
        uint64 current = _now(job);
        if (current > job.joinDeadline) revert DeadlinePassed(job.joinDeadline, current);
        _requireMember();
        Participant storage p = _participants[jobId][msg.sender];
        if (p.joined) revert AlreadyJoined(jobId, msg.sender);
        if (job.participantCount >= MAX_PARTICIPANTS) revert TooManyParticipants(MAX_PARTICIPANTS);
        uint64 samples = dataRegistry.usableSamples(datasetId, msg.sender); // 0: unknown or not usable
        if (samples == 0) revert DatasetNotUsable(datasetId, msg.sender);
        uint16 index = job.participantCount++;
        p.joined = true;
        p.index = index;
        p.datasetId = uint64(datasetId); // an existing id: below datasetCount
        p.samples = uint40(samples); // DataRegistry.MAX_SAMPLES < 2**40
        // A round has at most participantCount - committeeSize updates: every update index has
        // its two slots made nonzero here, by the participant that joins (see _updateAt).
        _updateAt[jobId][index] = EMPTY_TAG << 160;
        _participantAt[jobId][index] = msg.sender;
        _commitments[jobId][msg.sender] = bytes32(uint256(1));
        _scores[jobId][index] = EMPTY_TAG << SCORE_BITS;
        emit ParticipantJoined(jobId, msg.sender, datasetId, index);
    }

    /// @notice The proposer starts the job; the first committee is drawn on chain from the job's
    /// participants (`_drawCommittee`) with a seed of the block's prevrandao, the previous block's
    /// hash and the job id, so the proposer cannot choose it. What the proposer can do is pick
    /// the block it starts in (each block it waits is one more draw it may decline, visible on
    /// chain as a late start); it cannot pick the members.
    function startJob(uint256 jobId) external {
        Job storage job = _open(jobId);
        if (msg.sender != job.proposer) revert NotJobProposer(jobId, msg.sender);
        uint256 need = uint256(job.committeeSize) + job.minTrainers;
        if (job.participantCount < need) revert NotEnoughParticipants(job.participantCount, need);
        bytes32 seed = keccak256(abi.encode(block.prevrandao, blockhash(block.number - 1), jobId));
        address[] memory drawn = _drawCommittee(jobId, job, seed);
        job.status = Status.Running;
        emit JobStarted(jobId, drawn, seed);
        _openRound(jobId, job, 1);
    }

    function cancel(uint256 jobId) external {
        Job storage job = _job(jobId);
        if (msg.sender != job.proposer) revert NotJobProposer(jobId, msg.sender);
        if (job.status == Status.Cancelled) revert JobIsCancelled(jobId);
        if (job.status != Status.Open && job.status != Status.Running) revert JobNotRunning(jobId);
        job.status = Status.Cancelled;
        emit JobCancelled(jobId, job.round);
    }

    // ------------------------------------------------------------------ rounds

    /// @notice A trainer's update of the round. `spend`: the privacy spend of this release,
    /// recorded as `spendPrivacy` would (0: recorded already, or a job without DP); folding it in
    /// saves a transaction. A content hash is accepted at most once per round (DuplicateContent):
    /// a copied update is refused, not scored.
    function submitUpdate(
        uint256 jobId,
        uint16 round,
        bytes calldata modelRef,
        bytes32 contentHash,
        uint64 samples,
        uint64 spend
    ) external {
        Job storage job = _training(jobId, round);
        uint64 current = _now(job);
        if (current > job.updateDeadline) revert DeadlinePassed(job.updateDeadline, current);
        _requireMember();
        Participant storage p = _participants[jobId][msg.sender];
        if (!p.joined) revert NotParticipant(jobId, msg.sender);
        if (p.committeeRound == round) revert CommitteeCannotTrain(msg.sender);
        if (p.updateRound == round) revert DuplicateUpdate(msg.sender);
        _requireReference(modelRef);
        if (contentHash == bytes32(0)) revert InvalidUpdate("contentHash");
        if (samples == 0) revert InvalidUpdate("samples");
        if (samples > p.samples) revert SamplesAboveDataset(samples, p.samples);
        if (spend != 0) _recordSpend(jobId, job.maxSpendPerRound, round, p, spend);
        // One slot read each: both live in slots this call reads anyway.
        if (job.maxSpendPerRound != 0 && p.spendRound != round) revert SpendMissing(jobId, round, msg.sender);
        bytes32 contentKey = keccak256(abi.encode(jobId, round, contentHash));
        address owner = _contentOwner[contentKey];
        if (owner != address(0)) revert DuplicateContent(contentHash, owner);
        _contentOwner[contentKey] = msg.sender;
        uint16 index = job.updateCount++;
        p.updateRound = round;
        p.updateIndex = index;
        _updateAt[jobId][index] = (uint256(round) << 160) | uint160(msg.sender);
        emit UpdateSubmitted(jobId, round, msg.sender, index, modelRef, contentHash, samples);
    }

    /// @notice Records a release of this participant's data in `round` of a running job: `amount`
    /// micro-epsilon (1..maxSpendPerRound) against the dataset it joined with. `round` is the
    /// current round, or the next one while the current one aggregates (a trainer charges its
    /// speculative update before the round opens). At most MAX_SPENDS_PER_ROUND per round.
    function spendPrivacy(uint256 jobId, uint16 round, uint64 amount) external {
        Job storage job = _job(jobId);
        if (job.status == Status.Cancelled) revert JobIsCancelled(jobId);
        if (job.status != Status.Running) revert JobNotRunning(jobId);
        uint16 current = job.round;
        if (round != current && (job.phase != Phase.Aggregating || round != current + 1 || round > job.rounds)) {
            revert WrongRound(current, round);
        }
        _requireMember();
        Participant storage p = _participants[jobId][msg.sender];
        if (!p.joined) revert NotParticipant(jobId, msg.sender);
        _recordSpend(jobId, job.maxSpendPerRound, round, p, amount);
    }

    /// Records `amount` for msg.sender (participant `p`) in `round`: bounded by the job's plan,
    /// at most MAX_SPENDS_PER_ROUND per round, charged to the joined dataset.
    function _recordSpend(uint256 jobId, uint64 bound, uint16 round, Participant storage p, uint64 amount) private {
        if (amount == 0 || amount > bound) revert SpendOutOfBounds(jobId, amount, bound);
        uint16 last = p.spendRound;
        if (round < last) revert WrongRound(last, round);
        uint8 spends = round == last ? p.spends : 0;
        if (spends >= MAX_SPENDS_PER_ROUND) revert TooManySpends(jobId, round, msg.sender);
        p.spendRound = round;
        p.spends = spends + 1;
        dataRegistry.recordSpend(p.datasetId, jobId, round, msg.sender, amount);
    }

    /// @notice A committee member commits to its scores of the round: `commitment` is
    /// keccak256(abi.encode(jobId, round, member, trainers, scores, baseScore, salt)) with a secret
    /// salt (see `revealScores`). Due by the commit deadline: half the score period after the update
    /// deadline (`commitDeadline`), once scoring is open (every update in, or the update deadline).
    function commitScores(uint256 jobId, uint16 round, bytes32 commitment) external {
        if (commitment == bytes32(0)) revert InvalidUpdate("commitment");
        _commit(jobId, _training(jobId, round), round, commitment);
        _commitments[jobId][msg.sender] = commitment;
    }

    /// @notice The commitment that completes the committee's set and its reveal, in one
    /// transaction: once every other member is bound to its scores, a separate commitment hides
    /// nothing, so the last member to commit (a committee of one: its only member) saves a
    /// transaction. The same checks and events as `commitScores` then `revealScores` (the
    /// commitment in ScoresCommitted is that of a zero salt); reverts RevealNotOpen while another
    /// member's commitment is still due.
    function commitAndRevealScores(
        uint256 jobId,
        uint16 round,
        address[] calldata trainers,
        uint16[] calldata scores,
        uint16 baseScore
    ) external {
        Job storage job = _training(jobId, round);
        if (job.commitCount + 1 < job.committeeSize) revert RevealNotOpen(jobId);
        bytes32 commitment = keccak256(abi.encode(jobId, round, msg.sender, trainers, scores, baseScore, bytes32(0)));
        _commit(jobId, job, round, commitment);
        _reveal(jobId, job, round, trainers, scores, baseScore, false);
    }

    /// A member's commitment to its scores: scoring open, by the commit deadline, once a round.
    function _commit(uint256 jobId, Job storage job, uint16 round, bytes32 commitment) private {
        uint64 current = _now(job);
        if (job.updateCount < job.participantCount - job.committeeSize && current <= job.updateDeadline) {
            revert ScoringNotOpen(jobId);
        }
        uint64 due = _commitDeadline(job);
        if (current > due) revert DeadlinePassed(due, current);
        _requireMember();
        Participant storage member = _participants[jobId][msg.sender];
        if (!member.joined || member.committeeRound != round) revert NotCommitteeMember(msg.sender);
        if (member.commitRound == round) revert DuplicateScores(msg.sender);
        member.commitRound = round;
        job.commitCount += 1;
        emit ScoresCommitted(jobId, round, msg.sender, commitment);
    }

    /// @notice A member reveals the scores (0..10000) it committed to, for some or all of the
    /// round's updates, with its score of the round's base model (the current global model,
    /// unchanged): an update is accepted only when its median beats the median base score by the
    /// job's margin. Open once every member committed or the commit deadline passed; due by the
    /// score deadline. The reveal that completes the set finalizes the round in the same
    /// transaction (ScoresSubmitted, then RoundFinalized or JobFailed, as `finalizeRound` would):
    /// the whole committee, or, after the commit deadline, every member that committed.
    function revealScores(
        uint256 jobId,
        uint16 round,
        address[] calldata trainers,
        uint16[] calldata scores,
        uint16 baseScore,
        bytes32 salt
    ) external {
        Job storage job = _training(jobId, round);
        uint64 current = _now(job);
        if (current > job.scoreDeadline) revert DeadlinePassed(job.scoreDeadline, current);
        Participant storage member = _participants[jobId][msg.sender];
        if (member.commitRound != round) revert NotCommitted(msg.sender);
        if (member.scoreRound == round) revert DuplicateScores(msg.sender);
        bool commitsClosed = current > _commitDeadline(job);
        if (job.commitCount < job.committeeSize && !commitsClosed) revert RevealNotOpen(jobId);
        _checkReveal(jobId, round, trainers, scores, baseScore, salt);
        _reveal(jobId, job, round, trainers, scores, baseScore, commitsClosed);
    }

    /// A committed member's scores stored and announced; the reveal that completes the set
    /// (the whole committee, or after the commit deadline every member that committed) finalizes.
    function _reveal(
        uint256 jobId,
        Job storage job,
        uint16 round,
        address[] calldata trainers,
        uint16[] calldata scores,
        uint16 baseScore,
        bool commitsClosed
    ) private {
        Participant storage member = _participants[jobId][msg.sender];
        _storeReveal(jobId, round, member.seat, trainers, scores, baseScore);
        member.scoreRound = round;
        uint8 scored = job.scoreCount + 1;
        job.scoreCount = scored;
        emit ScoresSubmitted(jobId, round, msg.sender, trainers, scores, baseScore);
        if (scored >= job.committeeSize || (commitsClosed && scored >= job.commitCount)) _finalize(jobId, job, round);
    }

    /// One member's revealed scores and base score into the round's score slots (its seat's bits).
    function _storeReveal(
        uint256 jobId,
        uint16 round,
        uint8 seat,
        address[] calldata trainers,
        uint16[] calldata scores,
        uint16 baseScore
    ) private {
        if (trainers.length != scores.length) revert LengthMismatch(trainers.length, scores.length);
        if (baseScore > MAX_SCORE) revert ScoreOutOfRange(baseScore);
        uint256 shift = 16 * uint256(seat);
        _storeScores(jobId, round, shift, trainers, scores);
        uint256 base = _baseScores[jobId];
        if (base >> SCORE_BITS != round) base = uint256(round) << SCORE_BITS;
        _baseScores[jobId] = base | ((uint256(baseScore) + 1) << shift);
    }

    function _checkReveal(
        uint256 jobId,
        uint16 round,
        address[] calldata trainers,
        uint16[] calldata scores,
        uint16 baseScore,
        bytes32 salt
    ) private view {
        bytes32 digest = keccak256(abi.encode(jobId, round, msg.sender, trainers, scores, baseScore, salt));
        if (digest != _commitments[jobId][msg.sender]) revert CommitmentMismatch(msg.sender);
    }

    /// The commit deadline: the first half of the score period (the reveals get the rest).
    function _commitDeadline(Job storage job) private view returns (uint64) {
        return job.scoreDeadline - job.scorePeriod / 2;
    }

    /// One member's scores into the updates' score slots (its seat's 16 bits: score + 1).
    function _storeScores(
        uint256 jobId,
        uint16 round,
        uint256 shift,
        address[] calldata trainers,
        uint16[] calldata scores
    ) private {
        mapping(uint256 => uint256) storage roundScores = _scores[jobId];
        mapping(address => Participant) storage participants = _participants[jobId];
        for (uint256 i; i < trainers.length; ++i) {
            uint256 score = scores[i];
            if (score > MAX_SCORE) revert ScoreOutOfRange(score);
            Participant storage t = participants[trainers[i]];
            if (t.updateRound != round) revert UnknownUpdate(trainers[i]);
            uint256 key = t.updateIndex;
            uint256 packed = roundScores[key];
            // another round's scores (or the slot's initial tag): none for this round yet
            if (packed >> SCORE_BITS != round) packed = uint256(round) << SCORE_BITS;
            if ((packed >> shift) & 0xffff != 0) revert DuplicateScores(msg.sender);
            roundScores[key] = packed | ((score + 1) << shift);
        }
    }

    /// @notice Anyone, once the scoring deadline passed with scores missing, or the commit deadline
    /// passed with every committed member revealed (the reveal that completes the set finalizes
    /// the round itself, see `revealScores`; after that the round is
    /// no longer in training and this reverts with WrongPhase, or JobNotRunning if the job failed).
    function finalizeRound(uint256 jobId, uint16 round) external {
        Job storage job = _training(jobId, round);
        uint64 current = _now(job);
        // finalizable: every member revealed, the score deadline passed, or the commit deadline
        // passed and every member that committed revealed (none left to wait for)
        bool revealed = job.scoreCount >= job.commitCount && current > _commitDeadline(job);
        if (job.scoreCount < job.committeeSize && current <= job.scoreDeadline && !revealed) {
            revert RoundNotFinalizable(jobId);
        }
        _finalize(jobId, job, round);
    }

    /// @notice A member of the newly elected committee proposes the round's aggregated global model:
    /// its hash and its swarm reference, bound together (another member may propose the same hash
    /// with another reference; each pair collects its own votes).
    function proposeGlobalModel(uint256 jobId, uint16 round, bytes calldata modelRef, bytes32 modelHash) external {
        Job storage job = _aggregating(jobId, round);
        _requireReference(modelRef);
        if (modelHash == bytes32(0)) revert InvalidUpdate("modelHash");
        bytes32 refDigest = keccak256(modelRef);
        Proposal storage proposal = _proposals[_proposalKey(jobId, round, modelHash, refDigest)];
        if (proposal.votes != 0) revert ProposalExists(modelHash);
        proposal.proposer = msg.sender;
        proposal.votes = 1;
        proposal.refDigest = refDigest;
        emit GlobalModelProposed(jobId, round, msg.sender, modelRef, modelHash);
        _maybeFix(jobId, job, round, modelHash, proposal);
    }

    /// @notice Another member of the new committee confirms a proposal it recomputed: the same model
    /// hash AND the same reference (the aggregate's bytes are deterministic and stored unencrypted,
    /// so their reference is too). A confirmation of a pair nobody proposed reverts.
    function confirmGlobalModel(uint256 jobId, uint16 round, bytes32 modelHash, bytes calldata modelRef) external {
        Job storage job = _aggregating(jobId, round);
        bytes32 refDigest = keccak256(modelRef);
        Proposal storage proposal = _proposals[_proposalKey(jobId, round, modelHash, refDigest)];
        if (proposal.votes == 0) revert ProposalMismatch(modelHash);
        uint8 votes = ++proposal.votes;
        emit GlobalModelConfirmed(jobId, round, msg.sender, modelHash, refDigest, votes, quorum(job.committeeSize));
        _maybeFix(jobId, job, round, modelHash, proposal);
    }

    /// @notice Anyone (a member), once the aggregation deadline passed without a fixed model: the
    /// round keeps the previous global model, the committee that did not aggregate is replaced by
    /// one drawn afresh from all participants (see `_drawCommittee`), and the next round opens (or
    /// the job finishes after its last round). So a silent or split committee cannot stall a job.
    function skipAggregation(uint256 jobId, uint16 round) external {
        Job storage job = _running(jobId, round);
        if (job.phase != Phase.Aggregating) revert WrongPhase(jobId);
        uint64 current = _now(job);
        if (current <= job.scoreDeadline) revert AggregationNotOverdue(job.scoreDeadline, current);
        _requireMember();
        bytes32 seed = keccak256(abi.encode(block.prevrandao, jobId, round));
        address[] memory drawn = _drawCommittee(jobId, job, seed);
        emit AggregationSkipped(jobId, round, job.modelHash, drawn, seed);
        if (round == job.rounds) {
            job.status = Status.Finished;
            emit JobFinished(jobId, job.modelHash, job.modelRefDigest);
        } else {
            _openRound(jobId, job, round + 1);
        }
    }

    /// @notice Votes that fix a global model: a majority of the committee.
    function quorum(uint8 committeeSize) public pure returns (uint8) {
        return committeeSize / 2 + 1;
    }

    // ------------------------------------------------------------------ views

    function getJob(uint256 jobId) external view returns (Job memory) {
        return _job(jobId);
    }

    function committee(uint256 jobId) external view returns (address[] memory members) {
        Job storage job = _job(jobId);
        members = new address[](job.committeeSize);
        for (uint256 s; s < members.length; ++s) members[s] = _committee[jobId][s];
    }

    function getParticipant(uint256 jobId, address node) external view returns (Participant memory) {
        return _participants[jobId][node];
    }

    /// @notice The round's update at `index`: its trainer and packed scores (16 bits per seat, score + 1).
    function getUpdate(uint256 jobId, uint16 round, uint16 index)
        external
        view
        returns (address trainer, uint256 packedScores)
    {
        uint256 slot = _updateAt[jobId][index];
        if (slot >> 160 != round) return (address(0), 0); // another round's update, or none
        trainer = address(uint160(slot));
        packedScores = _roundScores(_scores[jobId][index], round);
    }

    /// @notice The committee's scores of the round's base model (16 bits per seat, score + 1).
    function getBaseScores(uint256 jobId, uint16 round) external view returns (uint256 packedScores) {
        return _roundScores(_baseScores[jobId], round);
    }

    /// @notice The trainer whose update of the round carries `contentHash` (zero when none).
    function contentOwner(uint256 jobId, uint16 round, bytes32 contentHash) external view returns (address) {
        return _contentOwner[keccak256(abi.encode(jobId, round, contentHash))];
    }

    function getProposal(uint256 jobId, uint16 round, bytes32 modelHash, bytes calldata modelRef)
        external
        view
        returns (Proposal memory)
    {
        return _proposals[_proposalKey(jobId, round, modelHash, keccak256(modelRef))];
    }

    // ------------------------------------------------------------------ internals

    /// Applies CommitteeRule to the round's scores: the accepted set and the next committee, or the
    /// job fails when fewer than minTrainers updates arrived.
    function _finalize(uint256 jobId, Job storage job, uint16 round) private {
        uint256 n = job.updateCount;
        if (n < job.minTrainers) {
            job.status = Status.Failed;
            emit JobFailed(jobId, round, uint16(n), job.minTrainers);
            return;
        }
        // Equal medians are ordered by keccak(tieSeed, trainer): drawn from this block, after
        // every update was sent, so no trainer can grind an address that wins ties.
        bytes32 tieSeed = keccak256(abi.encode(block.prevrandao, blockhash(block.number - 1), jobId, round));
        CommitteeRule.Outcome memory out = _decide(jobId, job, round, tieSeed);
        address[MAX_COMMITTEE] storage seats = _committee[jobId];
        for (uint256 s; s < out.nextCommittee.length; ++s) {
            address next = out.nextCommittee[s];
            seats[s] = next;
            Participant storage p = _participants[jobId][next];
            p.committeeRound = round + 1;
            p.seat = uint8(s);
        }
        job.phase = Phase.Aggregating;
        // The aggregation deadline (in the slot of the score deadline, which has passed its use):
        // the new committee proposes and confirms within a score period, or anyone skips.
        uint64 aggregateDeadline = _now(job) + job.scorePeriod;
        job.scoreDeadline = aggregateDeadline;
        emit RoundFinalized(
            jobId,
            round,
            out.ranking,
            out.medians,
            out.accepted,
            out.nextCommittee,
            out.baseMedian,
            job.margin,
            aggregateDeadline,
            tieSeed
        );
    }

    /// CommitteeRule over the round's updates, their scores and the base model's scores.
    function _decide(uint256 jobId, Job storage job, uint16 round, bytes32 tieSeed)
        private
        view
        returns (CommitteeRule.Outcome memory)
    {
        (address[] memory trainers, uint256[] memory packed) = _roundUpdates(jobId, round, job.updateCount);
        uint256 base = _roundScores(_baseScores[jobId], round);
        return CommitteeRule.decide(
            trainers,
            packed,
            job.topK,
            job.committeeSize,
            _currentCommittee(jobId, job.committeeSize),
            base,
            job.margin,
            tieSeed
        );
    }

    function _roundUpdates(uint256 jobId, uint16 round, uint256 n)
        private
        view
        returns (address[] memory trainers, uint256[] memory packed)
    {
        trainers = new address[](n);
        packed = new uint256[](n);
        for (uint256 i; i < n; ++i) {
            trainers[i] = address(uint160(_updateAt[jobId][i])); // written this round: i < updateCount
            packed[i] = _roundScores(_scores[jobId][i], round);
        }
    }

    function _currentCommittee(uint256 jobId, uint256 size) private view returns (address[] memory members) {
        members = new address[](size);
        address[MAX_COMMITTEE] storage seats = _committee[jobId];
        for (uint256 s; s < size; ++s) members[s] = seats[s];
    }

    function _proposalKey(uint256 jobId, uint16 round, bytes32 modelHash, bytes32 refDigest)
        private
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(jobId, round, modelHash, refDigest));
    }

    function _maybeFix(uint256 jobId, Job storage job, uint16 round, bytes32 modelHash, Proposal storage proposal)
        private
    {
        _participants[jobId][msg.sender].voteRound = round;
        if (proposal.votes < quorum(job.committeeSize)) return;
        job.modelHash = modelHash;
        job.modelRefDigest = proposal.refDigest;
        emit GlobalModelFixed(jobId, round, modelHash, proposal.refDigest, proposal.proposer);
        if (round == job.rounds) {
            job.status = Status.Finished;
            emit JobFinished(jobId, modelHash, proposal.refDigest);
        } else {
            _openRound(jobId, job, round + 1);
        }
    }

    function _openRound(uint256 jobId, Job storage job, uint16 round) private {
        uint64 current = _now(job);
        uint64 updateDeadline = current + job.trainPeriod;
        uint64 scoreDeadline = updateDeadline + job.scorePeriod;
        job.round = round;
        job.phase = Phase.Training;
        job.updateDeadline = updateDeadline;
        job.scoreDeadline = scoreDeadline;
        job.updateCount = 0;
        job.scoreCount = 0;
        job.commitCount = 0;
        address[] memory members = new address[](job.committeeSize);
        for (uint256 s; s < members.length; ++s) members[s] = _committee[jobId][s];
        emit RoundOpened(jobId, round, members, job.modelHash, updateDeadline, scoreDeadline);
    }

    /// Seats a committee for the round after the current one: the `committeeSize` participants
    /// with the smallest keccak256(seed, address), replacing the seated one. Nobody chooses it
    /// and no address is favoured: a node cannot grind an address that wins every draw, since the
    /// seed is not known when it registers. What bias remains: the seed comes from the block's
    /// prevrandao, which the block's proposer knows first and could withhold (forgoing its block)
    /// to redraw once; on a consortium chain the validators are known members whose misbehaviour
    /// is visible on chain, so one withheld block per draw is an accepted, observable risk.
    function _drawCommittee(uint256 jobId, Job storage job, bytes32 seed) private returns (address[] memory drawn) {
        uint256 size = job.committeeSize;
        uint16 next = job.round + 1;
        address[MAX_COMMITTEE] storage seats = _committee[jobId];
        for (uint256 s; s < size; ++s) {
            Participant storage old = _participants[jobId][seats[s]];
            if (old.committeeRound == next) old.committeeRound = 0;
        }
        drawn = new address[](size);
        bytes32[] memory keys = new bytes32[](size);
        uint256 filled;
        uint256 count = job.participantCount;
        for (uint256 i; i < count; ++i) {
            address a = _participantAt[jobId][i];
            bytes32 key = keccak256(abi.encode(seed, a));
            if (filled == size && key >= keys[size - 1]) continue;
            uint256 j = filled < size ? filled++ : size - 1;
            while (j > 0 && keys[j - 1] > key) {
                keys[j] = keys[j - 1];
                drawn[j] = drawn[j - 1];
                --j;
            }
            keys[j] = key;
            drawn[j] = a;
        }
        for (uint256 s; s < size; ++s) {
            seats[s] = drawn[s];
            Participant storage p = _participants[jobId][drawn[s]];
            p.committeeRound = next;
            p.seat = uint8(s);
        }
    }

    /// The seat bits of a packed score slot if it holds `round`'s scores, else none.
    function _roundScores(uint256 slot, uint16 round) private pure returns (uint256) {
        return slot >> SCORE_BITS == round ? slot & SCORE_MASK : 0;
    }

    function _job(uint256 jobId) private view returns (Job storage job) {
        job = _jobs[jobId];
        if (job.status == Status.None) revert UnknownJob(jobId);
    }

    function _open(uint256 jobId) private view returns (Job storage job) {
        job = _job(jobId);
        if (job.status == Status.Cancelled) revert JobIsCancelled(jobId);
        if (job.status != Status.Open) revert JobNotOpen(jobId);
    }

    function _running(uint256 jobId, uint16 round) private view returns (Job storage job) {
        job = _job(jobId);
        if (job.status == Status.Cancelled) revert JobIsCancelled(jobId);
        if (job.status != Status.Running) revert JobNotRunning(jobId);
        if (round != job.round) revert WrongRound(job.round, round);
    }

    function _training(uint256 jobId, uint16 round) private view returns (Job storage job) {
        job = _running(jobId, round);
        if (job.phase != Phase.Training) revert WrongPhase(jobId);
    }

    function _aggregating(uint256 jobId, uint16 round) private view returns (Job storage job) {
        job = _running(jobId, round);
        if (job.phase != Phase.Aggregating) revert WrongPhase(jobId);
        _requireMember();
        Participant storage p = _participants[jobId][msg.sender];
        if (!p.joined || p.committeeRound != round + 1) revert NotCommitteeMember(msg.sender);
        if (p.voteRound == round) revert AlreadyVoted(msg.sender);
    }

    function _requireMember() private view {
        if (!registry.isMember(msg.sender)) revert NotMember(msg.sender);
    }

    function _requireReference(bytes calldata modelRef) private pure {
        if (modelRef.length != 32 && modelRef.length != 64) revert InvalidReference(modelRef.length);
    }

    function _now(Job storage job) private view returns (uint64) {
        return uint64(job.useBlocks ? block.number : block.timestamp);
    }
}
