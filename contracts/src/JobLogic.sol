// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import "./Errors.sol";
import {FederatedLearningState, JobSpec} from "./FederatedLearningState.sol";
import {CommitteeRule} from "./CommitteeRule.sol";

/// @title JobLogic: a job's large steps (its proposal, its committee draws, its rounds' decisions),
/// run by DELEGATECALL from FederatedLearning.
/// @notice The steps of FederatedLearning that are large and run once a round or once a job (a
/// proposal's checks, the committee draws, CommitteeRule at finalization), kept out of its bytecode so that it stays
/// well below the 24,576-byte limit. FederatedLearning calls them with DELEGATECALL after its own
/// checks, so they act on its storage and their events are its events. Called directly, they
/// act on this contract's own storage, which holds nothing.
contract JobLogic is FederatedLearningState {
    /// A job's proposal (FederatedLearning.proposeJob checked the proposer's membership and the
    /// committee rule of the deployment): the spec's bounds, the job's storage, JobProposed.
    function propose(JobSpec calldata spec) external returns (uint256 jobId) {
        if (spec.configHash == bytes32(0)) revert InvalidJobSpec("configHash");
        _requireReference(spec.initialModelRef);
        if (spec.initialModelHash == bytes32(0)) revert InvalidJobSpec("initialModelHash");
        if (spec.rounds == 0 || spec.rounds > MAX_ROUNDS) revert InvalidJobSpec("rounds");
        if (spec.committeeSize == 0 || spec.committeeSize > MAX_COMMITTEE) revert InvalidJobSpec("committeeSize");
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

    /// Seats the first committee from the participants that revealed, and opens round 1 (or fails
    /// the job when fewer than a committee and minTrainers revealed).
    function drawFirst(uint256 jobId) external {
        Job storage job = _jobs[jobId];
        uint16 revealed = job.revealCount;
        if (revealed < uint256(job.committeeSize) + job.minTrainers) {
            job.status = Status.Failed;
            emit JobFailed(jobId, 0, revealed, job.minTrainers);
            return;
        }
        bytes32 seed = keccak256(abi.encode(job.mix, jobId));
        job.seed = seed;
        address[] memory drawn = _drawCommittee(jobId, job, seed);
        job.status = Status.Running;
        emit JobStarted(jobId, drawn, seed);
        _openRound(jobId, job, 1);
    }

    /// Applies CommitteeRule to the round's scores (the accepted set) and draws the next committee
    /// with a seed the round's revealed salts decided, or fails the job when fewer than minTrainers
    /// updates arrived. A member that committed and did not reveal is banned from later seats.
    function finalize(uint256 jobId, uint16 round) external {
        Job storage job = _jobs[jobId];
        uint256 n = job.updateCount;
        if (n < job.minTrainers) {
            job.status = Status.Failed;
            emit JobFailed(jobId, round, uint16(n), job.minTrainers);
            return;
        }
        _banWithheld(jobId, job, round);
        bytes32 seed = keccak256(abi.encode(job.seed, job.mix, round));
        job.seed = seed;
        Outcome memory out = _decide(jobId, job, round, n, seed);
        address[] memory next = _drawCommittee(jobId, job, seed);
        job.phase = Phase.Aggregating;
        // The aggregation deadline (in the slot of the score deadline, which has passed its use):
        // the new committee votes within a score period, or anyone skips.
        uint64 aggregateDeadline = _now(job) + job.scorePeriod;
        job.scoreDeadline = aggregateDeadline;
        emit RoundFinalized(
            jobId,
            round,
            out.trainers,
            out.medians,
            out.accepted,
            next,
            out.baseMedian,
            job.margin,
            aggregateDeadline,
            seed
        );
    }

    /// The aggregation deadline passed without a fixed model (FederatedLearning.skipAggregation
    /// checked it): the round keeps its model; the round after it is void (its early updates were
    /// trained on a model never fixed); a committee drawn with a seed fixed when the round was
    /// finalized takes the round after that, which opens (or the job finishes, if none is left).
    function skip(uint256 jobId, uint16 round) external {
        Job storage job = _jobs[jobId];
        bytes32 seed = keccak256(abi.encode(job.seed, uint256(2)));
        job.seed = seed;
        job.earlyCount = 0;
        if (round + 1 >= job.rounds) {
            emit AggregationSkipped(jobId, round, job.modelHash, new address[](0), seed);
            job.status = Status.Finished;
            emit JobFinished(jobId, job.modelHash, job.modelRefDigest);
            return;
        }
        job.round = round + 1; // void: never opened, so the draw seats the round after it
        address[] memory drawn = _drawCommittee(jobId, job, seed);
        emit AggregationSkipped(jobId, round, job.modelHash, drawn, seed);
        _openRound(jobId, job, round + 2);
    }

    struct Outcome {
        address[] trainers;
        uint16[] medians;
        address[] accepted;
        uint16 baseMedian;
    }

    /// CommitteeRule over the round's updates, their scores and the base model's scores.
    function _decide(uint256 jobId, Job storage job, uint16 round, uint256 n, bytes32 seed)
        private
        view
        returns (Outcome memory out)
    {
        uint256[] memory packed;
        (out.trainers, packed) = _roundUpdates(jobId, round, n);
        uint256 base = _roundScores(_baseScores[jobId], round);
        (out.medians, out.accepted, out.baseMedian) =
            CommitteeRule.decide(out.trainers, packed, job.topK, job.committeeSize, base, job.margin, seed);
    }

    /// Bans every member of the round's committee that committed to scores and did not reveal them.
    function _banWithheld(uint256 jobId, Job storage job, uint16 round) private {
        if (job.scoreCount >= job.commitCount) return; // every commitment was revealed
        address[MAX_COMMITTEE] storage seats = _committee[jobId];
        for (uint256 s; s < job.committeeSize; ++s) {
            Participant storage member = _participants[jobId][seats[s]];
            if (member.commitRound == round && member.scoreRound != round) {
                _participantAt[jobId][member.index] |= AT_BANNED;
                emit ScoresWithheld(jobId, round, seats[s]);
            }
        }
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

    /// Seats a committee for the round after the current one: the `committeeSize` drawn
    /// participants with the smallest keccak256(abi.encode(seed, 1, address)), banned ones only
    /// where too few others are left, replacing the seated one. Every drawn participant is equally
    /// likely to sit, whatever it scored or was scored: a coalition holds seats in proportion to
    /// its size, and no ranking it can steer elects it.
    function _drawCommittee(uint256 jobId, Job storage job, bytes32 seed) private returns (address[] memory drawn) {
        uint256 size = job.committeeSize;
        uint16 next = job.round + 1;
        address[MAX_COMMITTEE] storage seats = _committee[jobId];
        for (uint256 s; s < size; ++s) {
            Participant storage old = _participants[jobId][seats[s]];
            if (old.committeeRound == next) old.committeeRound = 0;
        }
        drawn = new address[](size);
        uint256[] memory keys = new uint256[](size);
        uint256 filled;
        uint256 count = job.participantCount;
        mapping(uint256 => uint256) storage entries = _participantAt[jobId];
        for (uint256 i; i < count; ++i) {
            uint256 entry = entries[i];
            if (entry & AT_DRAWN == 0) continue;
            address a = address(uint160(entry));
            // banned: after every other (the top bit), so seated only when too few others are left
            uint256 key = (uint256(keccak256(abi.encode(seed, 1, a))) >> 1) | (entry & AT_BANNED == 0 ? 0 : 1 << 255);
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
}
