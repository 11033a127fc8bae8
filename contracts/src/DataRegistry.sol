// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import "./Errors.sol";
import {INodeRegistry, IDataRegistry, IPreviousDataRegistry, IImportPart} from "./INodeRegistry.sol";

/// @title DataRegistry: dataset records, access grants and privacy budgets per source.
/// @notice A dataset record holds a commitment to its records, its schema and the swarm root
/// reference (32 bytes, never the decryption key). The commitment is KEYED with a secret only the
/// provider's node holds (an unkeyed hash of the records would let anyone who knows all records
/// but one test membership of the last): this contract does not interpret it, it only refuses the
/// same commitment twice. The data key travels only inside grants, wrapped (ECIES) for the
/// grantee's public key, and only in the `AccessGranted` event. A dataset may declare a public
/// hold-out split (`publicHoldoutHash`, zero when none): committee scores on it are released
/// without noise, and the declaration is public here and in DatasetRegistered.
///
/// Budgets belong to SOURCES, not uploads: a provider's datasets share one source (its first
/// non-disjoint dataset creates it) unless the provider declares a dataset disjoint from its
/// other data at registration (recorded in DatasetRegistered), which gives that dataset a source
/// of its own. A source's cap is the smallest cap of its datasets; every spend on any of its
/// datasets counts against it, the release its registration makes included (`initialSpend`: the
/// size a dataset registers is a DP count of its records; recorded in DatasetRegistered). So a
/// provider's copies of one dataset (rescaled, jittered, or re-uploaded) share a budget unless the
/// provider itself declares them disjoint.
///
/// Grants have caps and end: a grantee's spends also count against its grant's cap, and after
/// `revoke` every later spend by the grantee reverts (GrantRevoked), so its running jobs release
/// nothing more from the dataset. The owner rotates the data key (`rotateKey`: the re-encrypted
/// blob's reference) and re-wraps it for the remaining grantees with `grant`.
///
/// Privacy is counted in micro-epsilon (1_000_000 = epsilon 1.0). Spends are recorded only by the
/// FederatedLearning contract (wired once at deployment), which checks that the spender is a
/// participant of the running job and the amount within the job's plan.
///
/// A new contract version carries the datasets over (docs/OPERATIONS.md, Upgrades): deployed with
/// its `predecessor` (the version 1 DataRegistry; zero for a fresh consortium), it copies the
/// predecessor's datasets with `importDatasets` while the NodeRegistry's import is open (anyone may
/// call it: the data comes from the predecessor's views). Each keeps its id, owner, samples, cap,
/// commitment, schema, swarm reference and hold-out hash; version 1 had no sources, so each
/// becomes a source of its own carrying its cap and the privacy it spent, and its commitment stays
/// registered (it cannot be registered again with a fresh budget). Jobs of the old contracts may
/// still spend on the predecessor after the import: `syncSpent` (and every spend recorded here on
/// an imported dataset) adds what the predecessor recorded since, so the source counts every
/// release of both. Grants are not carried (version 1 kept the wrapped keys only in its events):
/// the owners' nodes grant again. The import closes with the NodeRegistry's (its members'
/// confirmation), which this contract's `importComplete` must allow.
contract DataRegistry is IDataRegistry, IImportPart {
    uint16 public constant PROTOCOL_VERSION = 2;
    uint64 public constant MAX_PRIVACY_CAP = 100_000_000; // epsilon 100
    // Samples fit the 40 bits FederatedLearning keeps per participant (and any signed 64-bit column).
    uint64 public constant MAX_SAMPLES = 1_000_000_000_000;
    uint256 public constant MAX_WRAPPED_KEY = 512; // an ECIES-wrapped 32-byte key is ~150 bytes
    // FederatedLearning keeps a participant's dataset id in 32 bits.
    uint256 public constant MAX_DATASETS = type(uint32).max;
    uint8 public constant MAX_SPEND_KIND = 2; // 0 update, 1 committee scores, 2 withheld update

    struct Dataset {
        address owner; // slot 0: owner + samples
        uint64 samples;
        uint64 sourceId; // slot 1
        uint64 privacyCap;
        bytes32 commitment; // keyed by the provider's node: reveals nothing about the records
        bytes32 schemaHash;
        bytes32 swarmRef;
        bytes32 publicHoldoutHash; // the hold-out split declared public (keyed too); zero when none
    }

    /// A privacy budget shared by datasets that may hold the same records. One storage slot (a
    /// spend rewrites a nonzero slot: 2.9k gas, not 22.1k); 48 bits hold any cap (<= 10^8).
    struct Source {
        address owner;
        uint48 cap; // the smallest cap of its datasets
        uint48 spent;
    }

    struct Grant {
        bool active;
        uint64 cap; // micro-epsilon the grantee's jobs may spend on the dataset, within the source's
        uint64 spent;
    }

    INodeRegistry public immutable registry;
    address public immutable deployer;
    IPreviousDataRegistry public immutable predecessor; // zero: nothing to import
    uint256 public importedCount; // datasets 1..importedCount are the predecessor's
    mapping(uint256 => uint64) private _carried; // imported dataset => the predecessor's spend counted
    address public spender; // the FederatedLearning contract, wired once by the deployer
    uint256 public datasetCount;
    uint256 public sourceCount;
    mapping(uint256 => Dataset) private _datasets;
    mapping(uint256 => Source) private _sources;
    mapping(address => uint256) private _sharedSource; // provider => its shared source (0: none yet)
    mapping(uint256 => mapping(address => Grant)) private _grants;
    mapping(uint256 => mapping(uint256 => uint64)) private _spentByJob;
    mapping(bytes32 => uint256) private _byCommitment; // commitment => dataset id

    event DatasetRegistered(
        uint256 indexed datasetId,
        address indexed owner,
        bytes32 commitment,
        bytes32 swarmRef,
        bytes32 schemaHash,
        uint64 samples,
        uint64 privacyCap,
        bytes32 publicHoldoutHash,
        uint256 sourceId,
        bool disjoint,
        uint64 initialSpend
    );
    event AccessGranted(
        uint256 indexed datasetId, address indexed owner, address indexed grantee, bytes wrappedKey, uint64 cap
    );
    event AccessRevoked(uint256 indexed datasetId, address indexed owner, address indexed grantee);
    event DatasetKeyRotated(uint256 indexed datasetId, bytes32 swarmRef);
    event PrivacySpent(
        uint256 indexed datasetId,
        uint256 indexed jobId,
        address indexed spender,
        uint16 round,
        uint64 amount,
        uint64 jobTotal,
        uint64 sourceTotal,
        uint8 kind,
        uint32 steps
    );
    event SpenderWired(address spender);
    /// The predecessor's spend on an imported dataset counted into its source (at the import, and
    /// what old jobs spent there since): `amount` added, `sourceTotal` the source's spend after.
    event PrivacyCarried(uint256 indexed datasetId, uint256 indexed sourceId, uint64 amount, uint64 sourceTotal);

    constructor(INodeRegistry registry_, IPreviousDataRegistry predecessor_) {
        registry = registry_;
        deployer = msg.sender;
        predecessor = predecessor_;
    }

    /// @notice Copies the predecessor's datasets `fromId`..`toId` (inclusive), keeping their ids,
    /// while the NodeRegistry's import is open. Datasets are copied in order (`fromId` at most
    /// `importedCount + 1`); one imported already only has its spend brought up to date.
    function importDatasets(uint256 fromId, uint256 toId) external {
        if (address(predecessor) == address(0) || !registry.importOpen()) revert ImportNotOpen();
        if (fromId == 0 || fromId > importedCount + 1 || toId < fromId || toId > predecessor.datasetCount()) {
            revert InvalidDataset("range");
        }
        for (uint256 id = fromId; id <= toId; ++id) {
            IPreviousDataRegistry.DatasetV1 memory old = predecessor.getDataset(id);
            if (id <= importedCount) {
                _carry(id, old.privacySpent);
                continue;
            }
            // the predecessor checked these at registration; checked again so a record this
            // contract could not have registered never enters it
            if (old.owner == address(0) || old.contentHash == bytes32(0)) revert InvalidDataset("predecessor");
            if (old.samples == 0 || old.samples > MAX_SAMPLES) revert InvalidDataset("samples");
            if (old.privacyCap > MAX_PRIVACY_CAP) revert InvalidDataset("privacyCap");
            uint256 existing = _byCommitment[old.contentHash];
            if (existing != 0) revert DuplicateDataset(old.contentHash, existing);
            uint256 sourceId = ++sourceCount;
            _sources[sourceId] = Source(old.owner, uint48(old.privacyCap), 0); // <= MAX_PRIVACY_CAP
            _byCommitment[old.contentHash] = id;
            _datasets[id] = Dataset(
                old.owner,
                old.samples,
                uint64(sourceId),
                old.privacyCap,
                old.contentHash,
                old.schemaHash,
                old.swarmRef,
                old.publicHoldoutHash
            );
            importedCount = id;
            datasetCount = id;
            emit DatasetRegistered(
                id,
                old.owner,
                old.contentHash,
                old.swarmRef,
                old.schemaHash,
                old.samples,
                old.privacyCap,
                old.publicHoldoutHash,
                sourceId,
                true,
                0
            );
            _carry(id, old.privacySpent);
        }
    }

    /// @notice Every dataset of the predecessor is carried (true without a predecessor).
    function importComplete() external view returns (bool) {
        return address(predecessor) == address(0) || importedCount == predecessor.datasetCount();
    }

    /// @notice Counts into an imported dataset's source what the predecessor recorded on it since
    /// (jobs of the old contracts finishing there). Anyone, at any time.
    function syncSpent(uint256 datasetId) public {
        if (datasetId == 0 || datasetId > importedCount) revert UnknownDataset(datasetId);
        _carry(datasetId, predecessor.getDataset(datasetId).privacySpent);
    }

    /// The predecessor's spend on an imported dataset is `spentThere` now: what it adds since last
    /// counted goes into the source, even past its cap (it was spent; later spends here refuse).
    function _carry(uint256 datasetId, uint64 spentThere) private {
        uint64 counted = _carried[datasetId];
        if (spentThere <= counted) return;
        _carried[datasetId] = spentThere;
        uint64 amount = spentThere - counted;
        uint256 sourceId = _datasets[datasetId].sourceId;
        Source storage source = _sources[sourceId];
        // both at most MAX_PRIVACY_CAP per spend history: far below 2^48
        source.spent += uint48(amount);
        emit PrivacyCarried(datasetId, sourceId, amount, source.spent);
    }

    /// @notice Names the FederatedLearning contract that records spends; once, by the deployer.
    function wireSpender(address spender_) external {
        if (msg.sender != deployer) revert Unauthorized(msg.sender);
        if (spender != address(0)) revert AlreadyWired(spender);
        if (spender_.code.length == 0) revert InvalidDataset("spender");
        spender = spender_;
        emit SpenderWired(spender_);
    }

    /// @notice Registers a dataset. `commitment`: a commitment to its records keyed by a secret of
    /// the provider's node. `disjoint`: the provider declares it shares no record with its other
    /// datasets, so it gets a budget source of its own; otherwise it joins the provider's shared one.
    /// `initialSpend`: the micro-epsilon of the release made at registration (`samples` is a DP
    /// count of the records, not their exact number), counted into the source's spend like any
    /// other release and recorded in DatasetRegistered; within the source's cap after this
    /// dataset's cap applies (InvalidDataset("initialSpend") otherwise). 0: no release.
    function registerDataset(
        bytes32 commitment,
        bytes32 swarmRef,
        bytes32 schemaHash,
        uint64 samples,
        uint64 privacyCap,
        bytes32 publicHoldoutHash,
        bool disjoint,
        uint64 initialSpend
    ) external returns (uint256 datasetId) {
        _requireMember(msg.sender);
        if (commitment == bytes32(0)) revert InvalidDataset("commitment");
        if (swarmRef == bytes32(0)) revert InvalidDataset("swarmRef");
        if (samples == 0 || samples > MAX_SAMPLES) revert InvalidDataset("samples");
        if (privacyCap > MAX_PRIVACY_CAP) revert InvalidDataset("privacyCap");
        if (datasetCount >= MAX_DATASETS) revert InvalidDataset("datasetCount");
        uint256 existing = _byCommitment[commitment];
        if (existing != 0) revert DuplicateDataset(commitment, existing);
        uint256 sourceId = disjoint ? 0 : _sharedSource[msg.sender];
        if (sourceId == 0) {
            // the whole budget is this dataset's cap (<= MAX_PRIVACY_CAP: both fit 48 bits)
            if (initialSpend > privacyCap) revert InvalidDataset("initialSpend");
            sourceId = ++sourceCount;
            _sources[sourceId] = Source(msg.sender, uint48(privacyCap), uint48(initialSpend));
            if (!disjoint) _sharedSource[msg.sender] = sourceId;
        } else {
            Source storage source = _sources[sourceId];
            uint48 cap = source.cap;
            if (privacyCap < cap) source.cap = cap = uint48(privacyCap); // the most restrictive wins
            if (initialSpend != 0) {
                // checked as recordSpend checks a spend, against the cap as this dataset leaves it
                uint48 spent = source.spent;
                if (uint256(spent) + initialSpend > cap) revert InvalidDataset("initialSpend");
                source.spent = spent + uint48(initialSpend); // at most the cap
            }
        }
        datasetId = ++datasetCount;
        _byCommitment[commitment] = datasetId;
        _datasets[datasetId] = Dataset(
            msg.sender, samples, uint64(sourceId), privacyCap, commitment, schemaHash, swarmRef, publicHoldoutHash
        );
        emit DatasetRegistered(
            datasetId,
            msg.sender,
            commitment,
            swarmRef,
            schemaHash,
            samples,
            privacyCap,
            publicHoldoutHash,
            sourceId,
            disjoint,
            initialSpend
        );
    }

    /// @notice Give `grantee` the data key, wrapped for its public key (kept in the event only), and
    /// a cap on what its jobs may spend from the dataset. Granting an active grantee again re-wraps
    /// the key (after `rotateKey`) and sets the cap, never below what it spent.
    function grant(uint256 datasetId, address grantee, bytes calldata wrappedKey, uint64 cap) external {
        _requireOwner(datasetId);
        _requireMember(grantee);
        if (grantee == msg.sender) revert InvalidDataset("grantee");
        if (wrappedKey.length == 0) revert InvalidDataset("wrappedKey");
        if (wrappedKey.length > MAX_WRAPPED_KEY) revert FieldTooLong("wrappedKey", wrappedKey.length, MAX_WRAPPED_KEY);
        if (cap == 0 || cap > MAX_PRIVACY_CAP) revert InvalidDataset("cap");
        Grant storage g = _grants[datasetId][grantee];
        if (cap < g.spent) revert InvalidDataset("cap");
        g.active = true;
        g.cap = cap;
        emit AccessGranted(datasetId, msg.sender, grantee, wrappedKey, cap);
    }

    /// @notice Ends a grant: the grantee can no longer join with the dataset, and every later spend
    /// of its jobs on it reverts. The owner should also rotate the data key (`rotateKey`).
    function revoke(uint256 datasetId, address grantee) external {
        _requireOwner(datasetId);
        Grant storage g = _grants[datasetId][grantee];
        if (!g.active) revert NotGranted(datasetId, grantee);
        g.active = false;
        emit AccessRevoked(datasetId, msg.sender, grantee);
    }

    /// @notice The owner re-encrypted the dataset under a fresh key: its new root reference. The
    /// old key (held by revoked grantees) opens nothing the owner still stores.
    function rotateKey(uint256 datasetId, bytes32 swarmRef) external {
        _requireOwner(datasetId);
        if (swarmRef == bytes32(0)) revert InvalidDataset("swarmRef");
        _datasets[datasetId].swarmRef = swarmRef;
        emit DatasetKeyRotated(datasetId, swarmRef);
    }

    /// @notice Records `participant`'s spend in round `round` of `jobId` on a dataset: against the
    /// dataset's source and, for a grantee, its grant. Only the wired FederatedLearning contract
    /// calls this (FederatedLearning.spendPrivacy checks the rest).
    function recordSpend(
        uint256 datasetId,
        uint256 jobId,
        uint16 round,
        address participant,
        uint64 amount,
        uint8 kind,
        uint32 steps
    ) external {
        if (msg.sender != spender) revert Unauthorized(msg.sender);
        if (kind > MAX_SPEND_KIND) revert InvalidDataset("kind");
        Dataset storage ds = _dataset(datasetId);
        if (datasetId <= importedCount) syncSpent(datasetId); // the old contracts' spends count too
        if (participant != ds.owner) {
            Grant storage g = _grants[datasetId][participant];
            if (!g.active) revert GrantRevoked(datasetId, participant);
            if (uint256(g.spent) + amount > g.cap) revert PrivacyBudgetExceeded(datasetId, g.spent, amount, g.cap);
            g.spent += amount;
        }
        Source storage source = _sources[ds.sourceId];
        uint64 spent = source.spent;
        if (uint256(spent) + amount > source.cap) {
            revert PrivacyBudgetExceeded(datasetId, spent, amount, source.cap);
        }
        source.spent = uint48(spent + amount); // at most the cap
        // cannot overflow: the job's total is part of the source's, which is below its cap
        uint64 jobTotal = _spentByJob[datasetId][jobId] + amount;
        _spentByJob[datasetId][jobId] = jobTotal;
        emit PrivacySpent(datasetId, jobId, participant, round, amount, jobTotal, spent + amount, kind, steps);
    }

    function canUse(uint256 datasetId, address account) external view returns (bool) {
        address owner = _datasets[datasetId].owner;
        return owner != address(0) && (owner == account || _grants[datasetId][account].active);
    }

    /// @notice The dataset's registered size and whether its hold-out is public, if `account` may use
    /// it (the owner, or an active grantee); (0, false) otherwise.
    function usage(uint256 datasetId, address account) external view returns (uint64 samples, bool publicHoldout) {
        Dataset storage ds = _datasets[datasetId];
        address owner = ds.owner;
        if (owner == address(0) || (owner != account && !_grants[datasetId][account].active)) return (0, false);
        return (ds.samples, ds.publicHoldoutHash != bytes32(0));
    }

    function getDataset(uint256 datasetId) external view returns (Dataset memory) {
        return _dataset(datasetId);
    }

    function getSource(uint256 sourceId) external view returns (Source memory) {
        return _sources[sourceId];
    }

    function sourceOf(uint256 datasetId) external view returns (uint256) {
        return _dataset(datasetId).sourceId;
    }

    function getGrant(uint256 datasetId, address grantee) external view returns (Grant memory) {
        return _grants[datasetId][grantee];
    }

    /// @notice The dataset registered with this commitment (0 when none).
    function datasetByCommitment(bytes32 commitment) external view returns (uint256) {
        return _byCommitment[commitment];
    }

    function isGranted(uint256 datasetId, address account) external view returns (bool) {
        return _grants[datasetId][account].active;
    }

    function privacySpentByJob(uint256 datasetId, uint256 jobId) external view returns (uint64) {
        return _spentByJob[datasetId][jobId];
    }

    function _dataset(uint256 datasetId) private view returns (Dataset storage ds) {
        ds = _datasets[datasetId];
        if (ds.owner == address(0)) revert UnknownDataset(datasetId);
    }

    /// A member that may act; while the NodeRegistry imports its predecessor, nobody (ImportOpen).
    function _requireMember(address account) private view {
        if (registry.isMember(account)) return;
        if (registry.importOpen()) revert ImportOpen();
        revert NotMember(account);
    }

    function _requireOwner(uint256 datasetId) private view {
        if (_dataset(datasetId).owner != msg.sender) revert NotDatasetOwner(datasetId, msg.sender);
    }
}
