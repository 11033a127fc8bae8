// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title CommitteeRule: which updates a round accepts and who sits on the next committee.
/// @notice Exactly fl_node/committee.py (BFLC committee consensus, Li et al. 2020), integers only.
/// `packedScores[i]` holds the scores of update i: 16 bits per committee seat, value score + 1
/// (0 = that member gave no score). Median over the present values, the LOWER of the middle pair
/// for even counts (an update passes only when more than half of the present scores say so: with
/// one seat of three silent, a colluder's 10000 against the honest member's 0 gives 0, not the
/// 5000 a mean would), 0 if none. Ranking: median desc, then keccak256(abi.encode(tieSeed,
/// trainer)) asc: equal medians are ordered by a value drawn per round, which no address can be
/// ground to win (the contract's seed comes from the finalizing block, unknown when updates are sent).
/// Base: the median of `baseScores` (the members' scores of the unchanged global model, packed the
/// same way; 0 if none). Accepted: the first `topK` ranked with median > base + margin, so an
/// update no better than the model it would replace (a constant or random model) never passes.
/// Next committee: the first `committeeSize` ranked trainers, remaining seats filled from
/// `current` in order.
library CommitteeRule {
    uint256 internal constant MAX_SCORE = 10_000;
    uint256 internal constant MAX_SEATS = 16;

    struct Outcome {
        address[] ranking;
        uint16[] medians; // in ranking order
        address[] accepted;
        address[] nextCommittee;
        uint16 baseMedian;
    }

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

    function decide(
        address[] memory trainers,
        uint256[] memory packedScores,
        uint256 topK,
        uint256 committeeSize,
        address[] memory current,
        uint256 baseScores,
        uint256 margin,
        bytes32 tieSeed
    ) internal pure returns (Outcome memory out) {
        uint256 scoreSeats = committeeSize < MAX_SEATS ? committeeSize : MAX_SEATS;
        uint256[] memory buffer = new uint256[](scoreSeats);
        (out.ranking, out.medians) = _rank(trainers, packedScores, scoreSeats, buffer, tieSeed);
        out.baseMedian = median(baseScores, scoreSeats, buffer);
        out.accepted = _accept(out.ranking, out.medians, topK, uint256(out.baseMedian) + margin);
        out.nextCommittee = _elect(out.ranking, committeeSize, current);
    }

    /// Trainers by median (desc), then keccak256(abi.encode(tieSeed, trainer)) (asc), with their medians.
    function _rank(
        address[] memory trainers,
        uint256[] memory packedScores,
        uint256 seats,
        uint256[] memory buffer,
        bytes32 tieSeed
    ) private pure returns (address[] memory ranking, uint16[] memory medians) {
        uint256 n = trainers.length;
        ranking = new address[](n);
        medians = new uint16[](n);
        bytes32[] memory ties = new bytes32[](n);
        for (uint256 i; i < n; ++i) {
            address t = trainers[i];
            uint16 m = median(packedScores[i], seats, buffer);
            bytes32 tie = keccak256(abi.encode(tieSeed, t));
            uint256 j = i;
            while (j > 0 && (m > medians[j - 1] || (m == medians[j - 1] && tie < ties[j - 1]))) {
                ranking[j] = ranking[j - 1];
                medians[j] = medians[j - 1];
                ties[j] = ties[j - 1];
                --j;
            }
            ranking[j] = t;
            medians[j] = m;
            ties[j] = tie;
        }
    }

    /// The first `topK` ranked whose median is above `threshold` (base median + margin).
    function _accept(address[] memory ranking, uint16[] memory medians, uint256 topK, uint256 threshold)
        private
        pure
        returns (address[] memory accepted)
    {
        uint256 count;
        while (count < ranking.length && count < topK && medians[count] > threshold) ++count;
        accepted = new address[](count);
        for (uint256 i; i < count; ++i) accepted[i] = ranking[i];
    }

    /// The first `committeeSize` ranked trainers, remaining seats from `current` in order.
    function _elect(address[] memory ranking, uint256 committeeSize, address[] memory current)
        private
        pure
        returns (address[] memory next)
    {
        next = new address[](committeeSize);
        uint256 seats;
        for (; seats < committeeSize && seats < ranking.length; ++seats) next[seats] = ranking[seats];
        for (uint256 c; c < current.length && seats < committeeSize; ++c) {
            if (!_contains(next, seats, current[c])) next[seats++] = current[c];
        }
        assembly {
            mstore(next, seats)
        }
    }

    function _contains(address[] memory list, uint256 len, address x) private pure returns (bool) {
        for (uint256 i; i < len; ++i) if (list[i] == x) return true;
        return false;
    }
}

/// @notice Test entry point: the rule as an external pure function, called with eth_call.
contract CommitteeRuleHarness {
    function decide(
        address[] calldata trainers,
        uint256[] calldata packedScores,
        uint256 topK,
        uint256 committeeSize,
        address[] calldata current,
        uint256 baseScores,
        uint256 margin,
        bytes32 tieSeed
    ) external pure returns (CommitteeRule.Outcome memory) {
        return CommitteeRule.decide(trainers, packedScores, topK, committeeSize, current, baseScores, margin, tieSeed);
    }
}
