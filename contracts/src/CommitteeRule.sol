// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title CommitteeRule: which updates a round accepts.
/// @notice Exactly fl_node/committee.py (BFLC committee consensus, Li et al. 2020), integers only.
/// `packedScores[i]` holds the scores of update i: 16 bits per committee seat, value score + 1
/// (0 = that member gave no score). Median over the present values, the LOWER of the middle pair
/// for even counts (an update passes only when more than half of the present scores say so: with
/// one seat of three silent, a colluder's 10000 against the honest member's 0 gives 0, not the
/// 5000 a mean would), 0 if none. Base: the median of `baseScores` (the members' scores of the
/// unchanged global model, packed the same way; 0 if none). Accepted: the `topK` best updates
/// whose median is above base + margin, so an update no better than the model it would replace
/// (a constant or random model) never passes; best means a higher median, then a smaller
/// keccak256(abi.encode(seed, 0, trainer)), with a seed no trainer knows when it submits.
/// Who sits on the next committee is not this rule's: the contract draws it (see
/// FederatedLearning._drawCommittee), so no ranking a coalition can steer elects anyone.
library CommitteeRule {
    uint256 internal constant MAX_SCORE = 10_000;
    uint256 internal constant MAX_SEATS = 16;

    /// @notice Median of the scores in `packed` over the first `seats` seats; `buffer` is scratch
    /// space of at least `seats` words (reused, so that no call allocates memory).
    function median(uint256 packed, uint256 seats, uint256[] memory buffer) internal pure returns (uint16) {
        uint256 n;
        for (uint256 seat; seat < seats; ++seat) {
            uint256 v = (packed >> (16 * seat)) & 0xffff;
            if (v == 0) continue;
            v -= 1;
            uint256 j = n;
            while (j > 0 && buffer[j - 1] > v) {
                buffer[j] = buffer[j - 1];
                --j;
            }
            buffer[j] = v;
            ++n;
        }
        if (n == 0) return 0;
        return uint16(buffer[(n - 1) / 2]); // the middle value, or the lower of the middle pair
    }

    /// The accepted so far, best first, with their medians and tie keys.
    struct Best {
        address[] trainers;
        uint256[] medians;
        bytes32[] ties;
        uint256 count;
    }

    /// @notice Each update's median (in the order given), the accepted trainers (best first) and
    /// the base median. O(n * topK): only the accepted are ordered.
    function decide(
        address[] memory trainers,
        uint256[] memory packedScores,
        uint256 topK,
        uint256 committeeSize,
        uint256 baseScores,
        uint256 margin,
        bytes32 seed
    ) internal pure returns (uint16[] memory medians, address[] memory accepted, uint16 baseMedian) {
        uint256 seats = committeeSize < MAX_SEATS ? committeeSize : MAX_SEATS;
        uint256[] memory buffer = new uint256[](seats);
        baseMedian = median(baseScores, seats, buffer);
        medians = new uint16[](trainers.length);
        for (uint256 i; i < medians.length; ++i) medians[i] = median(packedScores[i], seats, buffer);
        accepted = _accept(trainers, medians, topK, uint256(baseMedian) + margin, seed);
    }

    /// The `topK` best trainers whose median is above `threshold`, best first.
    function _accept(address[] memory trainers, uint16[] memory medians, uint256 topK, uint256 threshold, bytes32 seed)
        private
        pure
        returns (address[] memory accepted)
    {
        uint256 k = topK < trainers.length ? topK : trainers.length;
        Best memory best = Best(new address[](k), new uint256[](k), new bytes32[](k), 0);
        for (uint256 i; i < trainers.length; ++i) {
            uint256 m = medians[i];
            if (m > threshold) _offer(best, trainers[i], m, keccak256(abi.encode(seed, 0, trainers[i])));
        }
        accepted = best.trainers;
        uint256 count = best.count;
        assembly ("memory-safe") {
            mstore(accepted, count)
        }
    }

    /// Inserts a candidate into `best` (kept sorted, at most its capacity) if it ranks among them.
    function _offer(Best memory best, address trainer, uint256 m, bytes32 tie) private pure {
        uint256 k = best.trainers.length;
        if (best.count == k && !_better(m, tie, best.medians[k - 1], best.ties[k - 1])) return;
        uint256 j = best.count < k ? best.count++ : k - 1;
        while (j > 0 && _better(m, tie, best.medians[j - 1], best.ties[j - 1])) {
            best.trainers[j] = best.trainers[j - 1];
            best.medians[j] = best.medians[j - 1];
            best.ties[j] = best.ties[j - 1];
            --j;
        }
        best.trainers[j] = trainer;
        best.medians[j] = m;
        best.ties[j] = tie;
    }

    function _better(uint256 m, bytes32 tie, uint256 otherMedian, bytes32 otherTie) private pure returns (bool) {
        return m > otherMedian || (m == otherMedian && tie < otherTie);
    }
}

/// @notice Test entry point: the rule as an external pure function, called with eth_call.
contract CommitteeRuleHarness {
    function decide(
        address[] calldata trainers,
        uint256[] calldata packedScores,
        uint256 topK,
        uint256 committeeSize,
        uint256 baseScores,
        uint256 margin,
        bytes32 seed
    ) external pure returns (uint16[] memory medians, address[] memory accepted, uint16 baseMedian) {
        return CommitteeRule.decide(trainers, packedScores, topK, committeeSize, baseScores, margin, seed);
    }
}
