// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import "./Errors.sol";
import {INodeRegistry, IDataRegistry} from "./INodeRegistry.sol";
import {FederatedLearningState, JobSpec} from "./FederatedLearningState.sol";
import {JobLogic} from "./JobLogic.sol";

/// @title FederatedLearning: jobs, rounds and committee consensus (BFLC) for DeFL.
/// @notice A job is proposed (`proposeJob`), joined (`join`: a dataset and a commitment to a secret
/// draw value), and started (`startJob`): the participants then reveal their draw secrets
/// (`revealDrawSecret`), and the first committee is drawn from the XOR of the revealed secrets by
/// the last reveal, or by anyone after the reveal deadline (`drawCommittee`); a participant that
/// did not reveal takes no further part in the job. Round r of a running job: participants outside
/// the round's committee submit one update each (`submitUpdate`); committee members score the
/// updates once the updates are all in or the training deadline passed, by commit and reveal
/// (`commitScores` by the commit deadline, half the score period; `revealScores` once every member
/// committed or the commit deadline passed). The reveal that completes the set finalizes the round;
/// otherwise anyone calls `finalizeRound` after the score deadline. Finalizing applies
/// CommitteeRule (the accepted set) and DRAWS the next committee; the next committee aggregates
/// off chain and votes for the (hash, reference) pair it computed (`voteGlobalModel`): a majority
/// (committeeSize / 2 + 1) fixes the model and opens round r + 1 (or finishes the job).
///
/// Randomness nobody can choose: every draw (the first committee, each next committee, the
/// committee after a skipped aggregation, the order of equal medians) comes from secrets the
/// members committed to before they could see each other's: the participants' draw secrets (at
/// the start) and the committee members' score salts (each round, XORed in as they are revealed,
/// so the order of reveals in a block does not matter). No value a caller or a block producer can
/// read or set when it acts (prevrandao, a block hash, a timestamp) enters a draw. The one choice
/// left is the last revealer's: reveal or withhold. Withholding costs it its part in the job (a
/// draw secret) or its scores and every later committee seat (a score salt: `ScoresWithheld`).
///
/// Deadlines are in seconds (block.timestamp) or, with `useBlocks`, in blocks. Only references,
/// hashes, scores and membership are stored or emitted.
///
/// Privacy: a job's spec plans `maxSpendPerRound` (micro-epsilon, 1_000_000 = epsilon 1.0; 0 for
/// a job without DP). A participant records each release of its data with `spendPrivacy(jobId,
/// round, amount, kind, steps)` (kind 0 a published update, 1 committee scores, 2 a withheld
/// update): the spend counts against the dataset's budget source (and a grantee's grant; see
/// DataRegistry), is at most the planned bound, and at most MAX_SPENDS_PER_ROUND per participant
/// and round. In a job with DP, `submitUpdate` requires the trainer's spend for that round, and a
/// reveal of scores requires the member's score spend, unless its dataset's hold-out is public.
///
/// Committee: odd and at least 3, so that a single member can neither fix a model nor carry a
/// score's median, unless the deployment was made for development with `allowSmallCommittees`.
///
/// Votes bind the model hash AND its swarm reference: each pair collects its own votes, so a right
/// hash with a bogus (or oversized) reference never gathers honest votes.
///
/// Bounds: every value this contract accepts is bounded as the job configuration bounds it
/// (fl_node/job limits), so the mirrors of all nodes can store it.
contract FederatedLearning is FederatedLearningState {
    INodeRegistry public immutable registry;
    IDataRegistry public immutable dataRegistry;
    /// Development deployments only: committees of 1, 2 or any even size are accepted.
    bool public immutable allowSmallCommittees;
    /// The code of the draws and round decisions (JobLogic), run on this contract's storage.
    address public immutable logic;

    /// `firstJobId`: job ids continue after this number (an upgrade passes the predecessor's
    /// jobCount, so no new job takes an old job's id in the nodes' records; 0 for a new consortium).
    constructor(
        INodeRegistry registry_,
        IDataRegistry dataRegistry_,
        bool allowSmallCommittees_,
        JobLogic logic_,
        uint256 firstJobId
    ) {
        registry = registry_;
        dataRegistry = dataRegistry_;
        allowSmallCommittees = allowSmallCommittees_;
        logic = address(logic_);
        jobCount = firstJobId;
    }

    // ------------------------------------------------------------------ jobs

    function proposeJob(JobSpec calldata spec) external returns (uint256 jobId) {
        _requireMember();
        // One member of a committee of 1 or 2 fixes models and carries medians alone; an even
        // committee splits its votes. Small ones only on a development deployment.
        if (!allowSmallCommittees && (spec.committeeSize < 3 || spec.committeeSize % 2 == 0)) {
            revert InvalidJobSpec("committeeSize must be odd and at least 3");
        }
        jobId = abi.decode(_delegate(abi.encodeCall(JobLogic.propose, (spec))), (uint256));
    }

    /// @notice Joins with a dataset this member may use and a commitment to a secret it reveals when
    /// the job starts: `drawCommitment` = keccak256(abi.encode(jobId, msg.sender, secret)).
    function join(uint256 jobId, uint256 datasetId, bytes32 drawCommitment) external {
        Job storage job = _open(jobId);
        uint64 current = _now(job);
        if (current > job.joinDeadline) revert DeadlinePassed(job.joinDeadline, current);
        _requireMember();
        Participant storage p = _participants[jobId][msg.sender];
        if (p.joined) revert AlreadyJoined(jobId, msg.sender);
        if (job.participantCount >= MAX_PARTICIPANTS) revert TooManyParticipants(MAX_PARTICIPANTS);
        if (drawCommitment == bytes32(0) || drawCommitment == bytes32(uint256(1))) {
            revert InvalidUpdate("drawCommitment");
        }
        (uint64 samples, bool publicHoldout) = dataRegistry.usage(datasetId, msg.sender); // 0: not usable
        if (samples == 0) revert DatasetNotUsable(datasetId, msg.sender);
        uint16 index = job.participantCount++;
        p.joined = true;
        p.index = index;
        p.datasetId = uint32(datasetId); // an existing id: at most DataRegistry.MAX_DATASETS
        p.samples = uint40(samples); // DataRegistry.MAX_SAMPLES < 2**40
        if (publicHoldout) p.flags = PUBLIC_HOLDOUT;
        // A round has at most participantCount - committeeSize updates: every update index has
        // its two slots made nonzero here, by the participant that joins (see _updateAt).
        _updateAt[jobId][index] = EMPTY_TAG << 160;
        _participantAt[jobId][index] = uint160(msg.sender);
        _commitments[jobId][msg.sender] = drawCommitment;
        _scores[jobId][index] = EMPTY_TAG << SCORE_BITS;
        emit ParticipantJoined(jobId, msg.sender, datasetId, index);
    }

    /// @notice The proposer closes the joins; the participants then reveal their draw secrets within
    /// a score period, and the first committee is drawn from them. The proposer chooses nothing of
    /// the draw: the secrets were committed before anyone could see another's.
    function startJob(uint256 jobId) external {
        Job storage job = _open(jobId);
        if (msg.sender != job.proposer) revert NotJobProposer(jobId, msg.sender);
        uint256 need = uint256(job.committeeSize) + job.minTrainers;
        if (job.participantCount < need) revert NotEnoughParticipants(job.participantCount, need);
        job.status = Status.Drawing;
        uint64 deadline = _now(job) + job.scorePeriod;
        job.updateDeadline = deadline;
        emit DrawOpened(jobId, deadline);
    }

    /// @notice A participant's draw secret (committed at join). The reveal that completes the set
    /// draws the first committee and opens round 1.
    function revealDrawSecret(uint256 jobId, bytes32 secret) external {
        Job storage job = _job(jobId);
        if (job.status != Status.Drawing) revert DrawNotOpen(jobId);
        uint64 current = _now(job);
        if (current > job.updateDeadline) revert DeadlinePassed(job.updateDeadline, current);
        Participant storage p = _participants[jobId][msg.sender];
        if (!p.joined) revert NotParticipant(jobId, msg.sender);
        if (p.flags & DRAWN != 0) revert AlreadyRevealed(msg.sender);
        if (keccak256(abi.encode(jobId, msg.sender, secret)) != _commitments[jobId][msg.sender]) {
            revert DrawSecretMismatch(msg.sender);
        }
        p.flags |= DRAWN;
        _participantAt[jobId][p.index] |= AT_DRAWN;
        job.mix ^= keccak256(abi.encode(secret, msg.sender));
        uint16 revealed = ++job.revealCount;
        emit DrawSecretRevealed(jobId, msg.sender, revealed);
        if (revealed == job.participantCount) _drawFirst(jobId, job);
    }

    /// @notice Anyone (a member), after the reveal deadline: draws the first committee from the
    /// participants that revealed; the others take no part in the job. Fails the job when too few
    /// revealed.
    function drawCommittee(uint256 jobId) external {
        Job storage job = _job(jobId);
        if (job.status != Status.Drawing) revert DrawNotOpen(jobId);
        uint64 current = _now(job);
        if (current <= job.updateDeadline) revert DrawNotOverdue(job.updateDeadline, current);
        _requireMember();
        _drawFirst(jobId, job);
    }

    function cancel(uint256 jobId) external {
        Job storage job = _job(jobId);
        if (msg.sender != job.proposer) revert NotJobProposer(jobId, msg.sender);
        Status status = job.status;
        if (status == Status.Cancelled) revert JobIsCancelled(jobId);
        if (status != Status.Open && status != Status.Running && status != Status.Drawing) revert JobNotRunning(jobId);
        job.status = Status.Cancelled;
        emit JobCancelled(jobId, job.round);
    }

    // ------------------------------------------------------------------ rounds

    /// @notice A trainer's update of the round. `spend`: the privacy spend of this release,
    /// recorded as `spendPrivacy` would with kind 0 (0: recorded already, or a job without DP);
    /// folding it in saves a transaction. A content hash is accepted at most once per round
    /// (DuplicateContent): a copied update is refused, not scored.
    /// Early: while round r aggregates, a trainer of round r + 1 (not on the committee drawn for it)
    /// may send its round r + 1 update at once, trained on its own aggregate of r's accepted
    /// updates (deterministic: every honest node computes the same bytes), so a round's updates
    /// land in the block that fixes the previous model rather than in a block after it. It counts
    /// as one of round r + 1's updates when that round opens; if r's aggregation is skipped
    /// instead, round r + 1 is void with it.
    function submitUpdate(
        uint256 jobId,
        uint16 round,
        bytes calldata modelRef,
        bytes32 contentHash,
        uint64 samples,
        uint64 spend
    ) external {
        Job storage job = _job(jobId);
        if (job.status != Status.Running) {
            if (job.status == Status.Cancelled) revert JobIsCancelled(jobId);
            revert JobNotRunning(jobId);
        }
        bool early = job.phase == Phase.Aggregating && round == job.round + 1 && round <= job.rounds;
        if (!early) {
            if (round != job.round) revert WrongRound(job.round, round);
            if (job.phase != Phase.Training) revert WrongPhase(jobId);
            uint64 current = _now(job);
            if (current > job.updateDeadline) revert DeadlinePassed(job.updateDeadline, current);
        }
        _requireMember();
        Participant storage p = _participants[jobId][msg.sender];
        if (p.flags & DRAWN == 0) revert NotDrawn(msg.sender); // not joined, or did not reveal
        if (p.committeeRound == round) revert CommitteeCannotTrain(msg.sender);
        if (p.updateRound == round) revert DuplicateUpdate(msg.sender);
        _requireReference(modelRef);
        if (contentHash == bytes32(0)) revert InvalidUpdate("contentHash");
        if (samples == 0) revert InvalidUpdate("samples");
        if (samples > p.samples) revert SamplesAboveDataset(samples, p.samples);
        if (spend != 0) _recordSpend(jobId, job.maxSpendPerRound, round, p, spend, 0, 0);
        // One slot read each: both live in slots this call reads anyway.
        if (job.maxSpendPerRound != 0 && p.spendRound != round) revert SpendMissing(jobId, round, msg.sender);
        bytes32 contentKey = keccak256(abi.encode(jobId, round, contentHash));
        address owner = _contentOwner[contentKey];
        if (owner != address(0)) revert DuplicateContent(contentHash, owner);
        _contentOwner[contentKey] = msg.sender;
        // An early update takes the next index of the next round (round r's slots are read only
        // when it was finalized, which it is: it aggregates).
        uint16 index = early ? job.earlyCount++ : job.updateCount++;
        p.updateRound = round;
        p.updateIndex = index;
        _updateAt[jobId][index] = (uint256(round) << 160) | uint160(msg.sender);
        emit UpdateSubmitted(jobId, round, msg.sender, index, modelRef, contentHash, samples);
    }

    /// @notice Records a release of this participant's data in `round` of a running job: `amount`
    /// micro-epsilon (1..maxSpendPerRound) against the dataset it joined with; `kind` 0 a published
    /// update, 1 committee scores, 2 a withheld update; `steps` its local steps (0: not training).
    /// `round` is the current round, or the next one while the current one aggregates (a trainer
    /// charges its speculative update before the round opens). At most MAX_SPENDS_PER_ROUND a round.
    function spendPrivacy(uint256 jobId, uint16 round, uint64 amount, uint8 kind, uint32 steps) external {
        Job storage job = _job(jobId);
        if (job.status == Status.Cancelled) revert JobIsCancelled(jobId);
        if (job.status != Status.Running) revert JobNotRunning(jobId);
        uint16 current = job.round;
        if (round != current && (job.phase != Phase.Aggregating || round != current + 1 || round > job.rounds)) {
            revert WrongRound(current, round);
        }
        _requireMember();
        Participant storage p = _participants[jobId][msg.sender];
        if (p.flags & DRAWN == 0) revert NotDrawn(msg.sender);
        _recordSpend(jobId, job.maxSpendPerRound, round, p, amount, kind, steps);
    }

    /// Records `amount` for msg.sender (participant `p`) in `round`: bounded by the job's plan,
    /// at most MAX_SPENDS_PER_ROUND per round, charged to the joined dataset's source.
    function _recordSpend(
        uint256 jobId,
        uint64 bound,
        uint16 round,
        Participant storage p,
        uint64 amount,
        uint8 kind,
        uint32 steps
    ) private {
        if (amount == 0 || amount > bound) revert SpendOutOfBounds(jobId, amount, bound);
        uint16 last = p.spendRound;
        if (round < last) revert WrongRound(last, round);
        uint8 spends = round == last ? p.spends : 0;
        if (spends >= MAX_SPENDS_PER_ROUND) revert TooManySpends(jobId, round, msg.sender);
        p.spendRound = round;
        p.spends = spends + 1;
        if (kind == SPEND_SCORES) p.scoreSpendRound = round;
        dataRegistry.recordSpend(p.datasetId, jobId, round, msg.sender, amount, kind, steps);
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
    /// transaction. The same checks and events as `commitScores` then `revealScores`; reverts
    /// RevealNotOpen while another member's commitment is still due.
    function commitAndRevealScores(
        uint256 jobId,
        uint16 round,
        address[] calldata trainers,
        uint16[] calldata scores,
        uint16 baseScore,
        bytes32 salt
    ) external {
        Job storage job = _training(jobId, round);
        if (job.commitCount + 1 < job.committeeSize) revert RevealNotOpen(jobId);
        bytes32 commitment = keccak256(abi.encode(jobId, round, msg.sender, trainers, scores, baseScore, salt));
        _commit(jobId, job, round, commitment);
        _reveal(jobId, job, round, trainers, scores, baseScore, salt, false);
    }

    /// A member's commitment to its scores: scoring open, by the commit deadline, once a round.
    function _commit(uint256 jobId, Job storage job, uint16 round, bytes32 commitment) private {
        uint64 current = _now(job);
        if (job.updateCount < job.revealCount - job.committeeSize && current <= job.updateDeadline) {
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
    /// unchanged) and the salt, which is XORed into the job's random state: an update is accepted
    /// only when its median beats the median base score by the job's margin. Open once every
    /// member committed or the commit deadline passed; due by the score deadline. In a job with DP
    /// the member's score spend of the round must be recorded first (unless its hold-out is
    /// public). The reveal that completes the set finalizes the round in the same transaction: the
    /// whole committee, or, after the commit deadline, every member that committed.
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
        bytes32 digest = keccak256(abi.encode(jobId, round, msg.sender, trainers, scores, baseScore, salt));
        if (digest != _commitments[jobId][msg.sender]) revert CommitmentMismatch(msg.sender);
        _reveal(jobId, job, round, trainers, scores, baseScore, salt, commitsClosed);
    }

    /// A committed member's scores stored and announced, its salt mixed into the job's random
    /// state; the reveal that completes the set (the whole committee, or after the commit
    /// deadline every member that committed) finalizes.
    function _reveal(
        uint256 jobId,
        Job storage job,
        uint16 round,
        address[] calldata trainers,
        uint16[] calldata scores,
        uint16 baseScore,
        bytes32 salt,
        bool commitsClosed
    ) private {
        Participant storage member = _participants[jobId][msg.sender];
        if (job.maxSpendPerRound != 0 && member.flags & PUBLIC_HOLDOUT == 0 && member.scoreSpendRound != round) {
            revert SpendMissing(jobId, round, msg.sender);
        }
        if (trainers.length != scores.length) revert LengthMismatch(trainers.length, scores.length);
        if (baseScore > MAX_SCORE) revert ScoreOutOfRange(baseScore);
        uint256 shift = 16 * uint256(member.seat);
        _storeScores(jobId, round, shift, trainers, scores);
        uint256 base = _baseScores[jobId];
        if (base >> SCORE_BITS != round) base = uint256(round) << SCORE_BITS;
        _baseScores[jobId] = base | ((uint256(baseScore) + 1) << shift);
        member.scoreRound = round;
        job.mix ^= keccak256(abi.encode(salt, msg.sender));
        uint8 scored = job.scoreCount + 1;
        job.scoreCount = scored;
        emit ScoresSubmitted(jobId, round, msg.sender, trainers, scores, baseScore);
        if (scored >= job.committeeSize || (commitsClosed && scored >= job.commitCount)) _finalize(jobId, job, round);
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

    /// @notice A member of the round's aggregating committee votes for the global model it
    /// recomputed: its hash AND its swarm reference (the aggregate's bytes are deterministic and
    /// stored unencrypted, so their reference is too). Every member votes at once; the first vote
    /// for a pair creates it; a majority of the committee for one pair fixes it.
    function voteGlobalModel(uint256 jobId, uint16 round, bytes calldata modelRef, bytes32 modelHash) external {
        Job storage job = _aggregating(jobId, round);
        _requireReference(modelRef);
        if (modelHash == bytes32(0)) revert InvalidUpdate("modelHash");
        bytes32 refDigest = keccak256(modelRef);
        Vote storage vote = _votes[_voteKey(jobId, round, modelHash, refDigest)];
        if (vote.votes == 0) {
            vote.proposer = msg.sender;
            vote.refDigest = refDigest;
        }
        uint8 votes = ++vote.votes;
        _participants[jobId][msg.sender].voteRound = round;
        uint8 needed = quorum(job.committeeSize);
        emit GlobalModelVoted(jobId, round, msg.sender, modelRef, modelHash, votes, needed);
        if (votes < needed) return;
        job.modelHash = modelHash;
        job.modelRefDigest = refDigest;
        emit GlobalModelFixed(jobId, round, modelHash, refDigest, vote.proposer);
        _nextRound(jobId, job, round, modelHash, refDigest);
    }

    /// @notice Anyone (a member), once the aggregation deadline passed without a fixed model: the
    /// round keeps the previous global model; the next round, whose early updates were trained on
    /// a model that was never fixed, is void; the committee that did not aggregate is replaced by
    /// one drawn afresh (with a seed fixed when the round was finalized, so the caller chooses
    /// nothing) for the round after it, which opens (or the job finishes, if none is left).
    function skipAggregation(uint256 jobId, uint16 round) external {
        Job storage job = _running(jobId, round);
        if (job.phase != Phase.Aggregating) revert WrongPhase(jobId);
        uint64 current = _now(job);
        if (current <= job.scoreDeadline) revert AggregationNotOverdue(job.scoreDeadline, current);
        _requireMember();
        _delegate(abi.encodeCall(JobLogic.skip, (jobId, round)));
    }

    // ------------------------------------------------------------------ views

    /// @notice Votes that fix a global model: a majority of the committee.
    function quorum(uint8 committeeSize) public pure returns (uint8) {
        return committeeSize / 2 + 1;
    }

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

    /// @notice Whether the participant sits on no later committee of the job (it withheld a reveal).
    function isBanned(uint256 jobId, address node) external view returns (bool) {
        Participant storage p = _participants[jobId][node];
        return p.joined && _participantAt[jobId][p.index] & AT_BANNED != 0;
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

    function getVote(uint256 jobId, uint16 round, bytes32 modelHash, bytes calldata modelRef)
        external
        view
        returns (Vote memory)
    {
        return _votes[_voteKey(jobId, round, modelHash, keccak256(modelRef))];
    }

    // ------------------------------------------------------------------ internals

    /// Seats the first committee and opens round 1 (JobLogic.drawFirst).
    function _drawFirst(uint256 jobId, Job storage) private {
        _delegate(abi.encodeCall(JobLogic.drawFirst, (jobId)));
    }

    /// The accepted set and the next committee (JobLogic.finalize).
    function _finalize(uint256 jobId, Job storage, uint16 round) private {
        _delegate(abi.encodeCall(JobLogic.finalize, (jobId, round)));
    }

    /// Runs one of JobLogic's steps on this contract's storage; its revert is this call's.
    function _delegate(bytes memory call) private returns (bytes memory result) {
        bool ok;
        (ok, result) = logic.delegatecall(call);
        if (!ok) {
            assembly ("memory-safe") {
                revert(add(result, 32), mload(result))
            }
        }
    }

    function _voteKey(uint256 jobId, uint16 round, bytes32 modelHash, bytes32 refDigest)
        private
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(jobId, round, modelHash, refDigest));
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
}
