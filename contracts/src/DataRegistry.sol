// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import "./Errors.sol";
import {INodeRegistry, IDataRegistry} from "./INodeRegistry.sol";

/// @title DataRegistry: dataset records, access grants and per-dataset privacy spend.
/// @notice A dataset record holds hashes and the swarm root reference (32 bytes, never the
/// decryption key). The data key travels only inside grants, wrapped (ECIES) for the grantee's
/// public key, and only in the `AccessGranted` event. A content hash is registered once: the
/// same records registered again (the hash is order-insensitive) are refused with the id of the
/// dataset that holds them, so they cannot get a second privacy budget on chain. A dataset may
/// declare a public hold-out split (`publicHoldoutHash`, zero when none): committee scores on it
/// are released without noise, and the declaration is public here and in DatasetRegistered.
/// Privacy is counted in micro-epsilon (1_000_000 = epsilon 1.0). Spends are recorded only by the
/// FederatedLearning contract (wired once at deployment), which checks that the spender is a
/// participant of the running job and the amount within the job's plan; this contract keeps the
/// per-dataset and per-job totals and refuses a spend that would pass the dataset's cap.
contract DataRegistry is IDataRegistry {
    uint64 public constant MAX_PRIVACY_CAP = 100_000_000; // epsilon 100
    // Samples fit the 40 bits FederatedLearning keeps per participant (and any signed 64-bit column).
    uint64 public constant MAX_SAMPLES = 1_000_000_000_000;
    uint256 public constant MAX_WRAPPED_KEY = 512; // an ECIES-wrapped 32-byte key is ~150 bytes

    struct Dataset {
        address owner; // slot 0: owner + samples
        uint64 samples;
        uint64 privacyCap; // slot 1: cap + spent
        uint64 privacySpent;
        bytes32 contentHash;
        bytes32 schemaHash;
        bytes32 swarmRef;
        bytes32 publicHoldoutHash; // the hold-out split declared public; zero when none
    }

    INodeRegistry public immutable registry;
    address public immutable deployer;
    address public spender; // the FederatedLearning contract, wired once by the deployer
    uint256 public datasetCount;
    mapping(uint256 => Dataset) private _datasets;
    mapping(uint256 => mapping(address => bool)) private _granted;
    mapping(uint256 => mapping(uint256 => uint64)) private _spentByJob;
    mapping(bytes32 => uint256) private _byContent; // content hash => dataset id

    event DatasetRegistered(
        uint256 indexed datasetId,
        address indexed owner,
        bytes32 contentHash,
        bytes32 swarmRef,
        bytes32 schemaHash,
        uint64 samples,
        uint64 privacyCap,
        bytes32 publicHoldoutHash
    );
    event AccessGranted(uint256 indexed datasetId, address indexed owner, address indexed grantee, bytes wrappedKey);
    event AccessRevoked(uint256 indexed datasetId, address indexed owner, address indexed grantee);
    event PrivacySpent(
        uint256 indexed datasetId,
        uint256 indexed jobId,
        address indexed spender,
        uint16 round,
        uint64 amount,
        uint64 jobTotal,
        uint64 datasetTotal
    );
    event SpenderWired(address spender);

    constructor(INodeRegistry registry_) {
        registry = registry_;
        deployer = msg.sender;
    }

    /// @notice Names the FederatedLearning contract that records spends; once, by the deployer.
    function wireSpender(address spender_) external {
        if (msg.sender != deployer) revert Unauthorized(msg.sender);
        if (spender != address(0)) revert AlreadyWired(spender);
        if (spender_.code.length == 0) revert InvalidDataset("spender");
        spender = spender_;
        emit SpenderWired(spender_);
    }

    function registerDataset(
        bytes32 contentHash,
        bytes32 swarmRef,
        bytes32 schemaHash,
        uint64 samples,
        uint64 privacyCap,
        bytes32 publicHoldoutHash
    ) external returns (uint256 datasetId) {
        if (!registry.isMember(msg.sender)) revert NotMember(msg.sender);
        if (contentHash == bytes32(0)) revert InvalidDataset("contentHash");
        if (swarmRef == bytes32(0)) revert InvalidDataset("swarmRef");
        if (samples == 0 || samples > MAX_SAMPLES) revert InvalidDataset("samples");
        if (privacyCap > MAX_PRIVACY_CAP) revert InvalidDataset("privacyCap");
        uint256 existing = _byContent[contentHash];
        if (existing != 0) revert DuplicateDataset(contentHash, existing);
        datasetId = ++datasetCount;
        _byContent[contentHash] = datasetId;
        _datasets[datasetId] =
            Dataset(msg.sender, samples, privacyCap, 0, contentHash, schemaHash, swarmRef, publicHoldoutHash);
        emit DatasetRegistered(
            datasetId, msg.sender, contentHash, swarmRef, schemaHash, samples, privacyCap, publicHoldoutHash
        );
    }

    /// @notice Give `grantee` the data key, wrapped for its public key (kept in the event only).
    function grant(uint256 datasetId, address grantee, bytes calldata wrappedKey) external {
        _requireOwner(datasetId);
        if (!registry.isMember(grantee)) revert NotMember(grantee);
        if (wrappedKey.length == 0) revert InvalidDataset("wrappedKey");
        if (wrappedKey.length > MAX_WRAPPED_KEY) revert FieldTooLong("wrappedKey", wrappedKey.length, MAX_WRAPPED_KEY);
        _granted[datasetId][grantee] = true;
        emit AccessGranted(datasetId, msg.sender, grantee, wrappedKey);
    }

    function revoke(uint256 datasetId, address grantee) external {
        _requireOwner(datasetId);
        if (!_granted[datasetId][grantee]) revert NotGranted(datasetId, grantee);
        delete _granted[datasetId][grantee];
        emit AccessRevoked(datasetId, msg.sender, grantee);
    }

    /// @notice Records `participant`'s spend in round `round` of `jobId` on a dataset. Only the
    /// wired FederatedLearning contract calls this (FederatedLearning.spendPrivacy checks the rest).
    function recordSpend(uint256 datasetId, uint256 jobId, uint16 round, address participant, uint64 amount)
        external
    {
        if (msg.sender != spender) revert Unauthorized(msg.sender);
        Dataset storage ds = _dataset(datasetId);
        uint64 spent = ds.privacySpent;
        if (uint256(spent) + amount > ds.privacyCap) {
            revert PrivacyBudgetExceeded(datasetId, spent, amount, ds.privacyCap);
        }
        ds.privacySpent = spent + amount;
        // cannot overflow: the job's total is part of the dataset's, which is below its cap
        uint64 jobTotal = _spentByJob[datasetId][jobId] + amount;
        _spentByJob[datasetId][jobId] = jobTotal;
        emit PrivacySpent(datasetId, jobId, participant, round, amount, jobTotal, spent + amount);
    }

    function canUse(uint256 datasetId, address account) external view returns (bool) {
        address owner = _datasets[datasetId].owner;
        return owner != address(0) && (owner == account || _granted[datasetId][account]);
    }

    function usableSamples(uint256 datasetId, address account) external view returns (uint64) {
        Dataset storage ds = _datasets[datasetId];
        address owner = ds.owner;
        if (owner == address(0) || (owner != account && !_granted[datasetId][account])) return 0;
        return ds.samples;
    }

    function getDataset(uint256 datasetId) external view returns (Dataset memory) {
        return _dataset(datasetId);
    }

    /// @notice The dataset registered with this content hash (0 when none).
    function datasetByContent(bytes32 contentHash) external view returns (uint256) {
        return _byContent[contentHash];
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
