// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

interface INodeRegistry {
    function isMember(address account) external view returns (bool);
}

interface IDataRegistry {
    function canUse(uint256 datasetId, address account) external view returns (bool);
}
