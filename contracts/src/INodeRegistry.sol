// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

interface INodeRegistry {
    function isMember(address account) external view returns (bool);

    /// @notice True while the registry imports its predecessor's members (until they confirm).
    function importOpen() external view returns (bool);
}

/// @notice The views of a previous release's NodeRegistry that an import reads (version 1 has
/// them with these signatures, and so does version 2).
interface IPreviousNodeRegistry {
    function isMember(address account) external view returns (bool);
    function memberCount() external view returns (uint256);
    function members() external view returns (address[] memory);
    function getNode(address account)
        external
        view
        returns (string memory name, string memory endpoint, bytes memory pubkey, bytes32 overlay, uint8 status);
}

/// @notice The views of the version 1 DataRegistry that an import reads: a dataset had its own
/// privacy budget (`privacySpent`), no budget source, and its commitment was `contentHash`.
interface IPreviousDataRegistry {
    struct DatasetV1 {
        address owner;
        uint64 samples;
        uint64 privacyCap;
        uint64 privacySpent;
        bytes32 contentHash;
        bytes32 schemaHash;
        bytes32 swarmRef;
        bytes32 publicHoldoutHash;
    }

    function datasetCount() external view returns (uint256);
    function getDataset(uint256 datasetId) external view returns (DatasetV1 memory);
}

/// @notice A contract whose import the NodeRegistry's confirmation closes (the DataRegistry): the
/// import may close only once it has carried everything.
interface IImportPart {
    function registry() external view returns (INodeRegistry);
    function importComplete() external view returns (bool);
}

interface IDataRegistry {
    function canUse(uint256 datasetId, address account) external view returns (bool);

    /// @notice The dataset's registered size and whether its hold-out is public, if `account` may use
    /// it (its owner or an active grantee); (0, false) otherwise.
    function usage(uint256 datasetId, address account) external view returns (uint64 samples, bool publicHoldout);

    /// @notice Records a participant's privacy spend; only the wired FederatedLearning contract.
    /// `kind`: 0 a published update, 1 committee scores, 2 a withheld (never published) update;
    /// `steps`: the local steps of a training release (0 otherwise).
    function recordSpend(
        uint256 datasetId,
        uint256 jobId,
        uint16 round,
        address participant,
        uint64 amount,
        uint8 kind,
        uint32 steps
    ) external;
}
