// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

interface INodeRegistry {
    function isMember(address account) external view returns (bool);
}

interface IDataRegistry {
    function canUse(uint256 datasetId, address account) external view returns (bool);

    /// @notice The dataset's registered sample count if `account` may use it, else 0.
    function usableSamples(uint256 datasetId, address account) external view returns (uint64);

    /// @notice Records a participant's privacy spend; only the wired FederatedLearning contract.
    function recordSpend(uint256 datasetId, uint256 jobId, uint16 round, address participant, uint64 amount)
        external;
}
