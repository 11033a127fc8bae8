// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import "./Errors.sol";
import {INodeRegistry, IDataRegistry} from "./INodeRegistry.sol";

/// @title DataRegistry: dataset records, access grants and per-dataset privacy spend.
/// @notice A dataset record holds hashes and the swarm root reference (32 bytes, never the
/// decryption key). The data key travels only inside grants, wrapped (ECIES) for the grantee's
/// public key, and only in the `AccessGranted` event. Privacy is counted in micro-epsilon
/// (1_000_000 = epsilon 1.0); a spend that would pass the dataset's cap is refused.
contract DataRegistry is IDataRegistry {
    struct Dataset {
        address owner; // slot 0: owner + samples
        uint64 samples;
        uint64 privacyCap; // slot 1: cap + spent
        uint64 privacySpent;
        bytes32 contentHash;
        bytes32 schemaHash;
        bytes32 swarmRef;
    }

    INodeRegistry public immutable registry;
    uint256 public datasetCount;
    mapping(uint256 => Dataset) private _datasets;
    mapping(uint256 => mapping(address => bool)) private _granted;
    mapping(uint256 => mapping(uint256 => uint64)) private _spentByJob;

    event DatasetRegistered(
        uint256 indexed datasetId,
        address indexed owner,
        bytes32 contentHash,
        bytes32 swarmRef,
        bytes32 schemaHash,
        uint64 samples,
        uint64 privacyCap
    );
    event AccessGranted(uint256 indexed datasetId, address indexed owner, address indexed grantee, bytes wrappedKey);
    event AccessRevoked(uint256 indexed datasetId, address indexed owner, address indexed grantee);
    event PrivacySpent(
        uint256 indexed datasetId,
        uint256 indexed jobId,
        address indexed spender,
        uint64 amount,
        uint64 jobTotal,
        uint64 datasetTotal
    );

    constructor(INodeRegistry registry_) {
        registry = registry_;
    }

    function registerDataset(
        bytes32 contentHash,
        bytes32 swarmRef,
        bytes32 schemaHash,
        uint64 samples,
        uint64 privacyCap
    ) external returns (uint256 datasetId) {
        if (!registry.isMember(msg.sender)) revert NotMember(msg.sender);
        if (contentHash == bytes32(0)) revert InvalidDataset("contentHash");
        if (swarmRef == bytes32(0)) revert InvalidDataset("swarmRef");
        if (samples == 0) revert InvalidDataset("samples");
        datasetId = ++datasetCount;
        _datasets[datasetId] = Dataset(msg.sender, samples, privacyCap, 0, contentHash, schemaHash, swarmRef);
        emit DatasetRegistered(datasetId, msg.sender, contentHash, swarmRef, schemaHash, samples, privacyCap);
    }

    /// @notice Give `grantee` the data key, wrapped for its public key (kept in the event only).
    function grant(uint256 datasetId, address grantee, bytes calldata wrappedKey) external {
        _requireOwner(datasetId);
        if (!registry.isMember(grantee)) revert NotMember(grantee);
        if (wrappedKey.length == 0) revert InvalidDataset("wrappedKey");
        _granted[datasetId][grantee] = true;
        emit AccessGranted(datasetId, msg.sender, grantee, wrappedKey);
    }

    function revoke(uint256 datasetId, address grantee) external {
        _requireOwner(datasetId);
        if (!_granted[datasetId][grantee]) revert NotGranted(datasetId, grantee);
        delete _granted[datasetId][grantee];
        emit AccessRevoked(datasetId, msg.sender, grantee);
    }

    /// @notice Record privacy spent by `jobId` on a dataset (by its owner or a grantee).
    function spendPrivacy(uint256 datasetId, uint256 jobId, uint64 amount) external {
        Dataset storage ds = _dataset(datasetId);
        if (ds.owner != msg.sender && !_granted[datasetId][msg.sender]) revert NotGranted(datasetId, msg.sender);
        uint64 spent = ds.privacySpent;
        if (uint256(spent) + amount > ds.privacyCap) {
            revert PrivacyBudgetExceeded(datasetId, spent, amount, ds.privacyCap);
        }
        ds.privacySpent = spent + amount;
        uint64 jobTotal = _spentByJob[datasetId][jobId] + amount;
        _spentByJob[datasetId][jobId] = jobTotal;
        emit PrivacySpent(datasetId, jobId, msg.sender, amount, jobTotal, spent + amount);
    }

    function canUse(uint256 datasetId, address account) external view returns (bool) {
        address owner = _datasets[datasetId].owner;
        return owner != address(0) && (owner == account || _granted[datasetId][account]);
    }

    function getDataset(uint256 datasetId) external view returns (Dataset memory) {
        return _dataset(datasetId);
    }

    function isGranted(uint256 datasetId, address account) external view returns (bool) {
        return _granted[datasetId][account];
    }

    function privacySpentByJob(uint256 datasetId, uint256 jobId) external view returns (uint64) {
        return _spentByJob[datasetId][jobId];
    }

    function _dataset(uint256 datasetId) private view returns (Dataset storage ds) {
        ds = _datasets[datasetId];
        if (ds.owner == address(0)) revert UnknownDataset(datasetId);
    }

    function _requireOwner(uint256 datasetId) private view {
        if (_dataset(datasetId).owner != msg.sender) revert NotDatasetOwner(datasetId, msg.sender);
    }
}
