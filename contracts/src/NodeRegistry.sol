// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import "./Errors.sol";
import {INodeRegistry} from "./INodeRegistry.sol";

/// @title NodeRegistry: the consortium of DeFL nodes.
/// @notice A node is its chain address with a name, an endpoint URL, its secp256k1 public key
/// (64 bytes, uncompressed without the 0x04 prefix; used for ECIES) and its swarm overlay address.
/// A node applies with `registerNode`; the members admit it by vote (`voteAdmission`) once
/// `votes * 100 >= members * thresholdPercent`. While the consortium has fewer than two members
/// the deployer's vote alone admits (bootstrap). Members update their endpoint, leave, and remove
/// a member by the same vote threshold. Votes are per application / removal attempt (epoch).
/// Names (at most 64 bytes) and endpoints (at most 256 bytes) are printable ASCII, an endpoint
/// without spaces: every node mirrors them, so no one can register a string it cannot store.
contract NodeRegistry is INodeRegistry {
    uint256 public constant MAX_NAME = 64;
    uint256 public constant MAX_ENDPOINT = 256;

    enum Status {
        None,
        Applied,
        Member
    }

    struct Node {
        string name;
        string endpoint;
        bytes pubkey;
        bytes32 overlay;
        Status status;
        uint32 epoch; // bumps on every admission / removal so that old votes never count twice
        uint32 admitVotes;
        uint32 removeVotes;
    }

    address public immutable deployer;
    uint8 public immutable thresholdPercent;

    mapping(address => Node) private _nodes;
    mapping(bytes32 => bool) private _voted; // keccak(kind, node, epoch, voter)
    address[] private _members;
    mapping(address => uint256) private _memberSlot; // index + 1 in _members

    event NodeApplied(address indexed node, string name, string endpoint, bytes pubkey, bytes32 overlay);
    event AdmissionVoted(address indexed node, address indexed voter, uint32 votes, uint32 needed);
    event NodeAdmitted(address indexed node, uint256 memberCount);
    event EndpointUpdated(address indexed node, string endpoint);
    event NodeLeft(address indexed node, uint256 memberCount);
    event RemovalVoted(address indexed node, address indexed voter, uint32 votes, uint32 needed);
    event NodeRemoved(address indexed node, uint256 memberCount);

    constructor(uint8 thresholdPercent_) {
        if (thresholdPercent_ == 0 || thresholdPercent_ > 100) revert EmptyField("thresholdPercent");
        deployer = msg.sender;
        thresholdPercent = thresholdPercent_;
    }

    modifier onlyMember() {
        if (_nodes[msg.sender].status != Status.Member) revert NotMember(msg.sender);
        _;
    }

    /// @notice Apply for membership; the deployer is admitted at once while there are < 2 members.
    function registerNode(string calldata name, string calldata endpoint, bytes calldata pubkey, bytes32 overlay)
        external
    {
        Node storage node = _nodes[msg.sender];
        if (node.status == Status.Member) revert AlreadyMember(msg.sender);
        if (node.status == Status.Applied) revert AlreadyApplied(msg.sender);
        _requireText("name", name, MAX_NAME, 0x20);
        _requireText("endpoint", endpoint, MAX_ENDPOINT, 0x21);
        if (pubkey.length != 64 || address(uint160(uint256(keccak256(pubkey)))) != msg.sender) {
            revert InvalidPublicKey(msg.sender);
        }
        node.name = name;
        node.endpoint = endpoint;
        node.pubkey = pubkey;
        node.overlay = overlay;
        node.status = Status.Applied;
        node.admitVotes = 0;
        emit NodeApplied(msg.sender, name, endpoint, pubkey, overlay);
        if (msg.sender == deployer && _members.length < 2) _admit(msg.sender, node);
    }

    /// @notice A member's vote (or the deployer's, during bootstrap) to admit an applicant.
    function voteAdmission(address applicant) external {
        Node storage node = _nodes[applicant];
        if (node.status != Status.Applied) revert NotApplicant(applicant);
        if (msg.sender == deployer && _members.length < 2) {
            emit AdmissionVoted(applicant, msg.sender, 1, 1);
            _admit(applicant, node);
            return;
        }
        if (_nodes[msg.sender].status != Status.Member) revert NotMember(msg.sender);
        bytes32 key = keccak256(abi.encode(uint8(1), applicant, node.epoch, msg.sender));
        if (_voted[key]) revert AlreadyVoted(msg.sender);
        _voted[key] = true;
        uint32 votes = ++node.admitVotes;
        uint32 needed = votesNeeded();
        emit AdmissionVoted(applicant, msg.sender, votes, needed);
        if (votes >= needed) _admit(applicant, node);
    }

    function updateEndpoint(string calldata endpoint) external onlyMember {
        _requireText("endpoint", endpoint, MAX_ENDPOINT, 0x21);
        _nodes[msg.sender].endpoint = endpoint;
        emit EndpointUpdated(msg.sender, endpoint);
    }

    function leaveConsortium() external onlyMember {
        _drop(msg.sender);
        emit NodeLeft(msg.sender, _members.length);
    }

    /// @notice A member's vote to remove another member (a member leaves with `leaveConsortium`).
    function voteRemoval(address member) external onlyMember {
        Node storage node = _nodes[member];
        if (node.status != Status.Member) revert NotMember(member);
        bytes32 key = keccak256(abi.encode(uint8(2), member, node.epoch, msg.sender));
        if (_voted[key]) revert AlreadyVoted(msg.sender);
        _voted[key] = true;
        uint32 votes = ++node.removeVotes;
        uint32 needed = votesNeeded();
        emit RemovalVoted(member, msg.sender, votes, needed);
        if (votes >= needed) {
            _drop(member);
            emit NodeRemoved(member, _members.length);
        }
    }

    /// @notice Votes needed now: the smallest v with v * 100 >= members * thresholdPercent (at least 1).
    function votesNeeded() public view returns (uint32) {
        uint256 needed = (_members.length * thresholdPercent + 99) / 100;
        return needed == 0 ? 1 : uint32(needed);
    }

    function isMember(address account) external view returns (bool) {
        return _nodes[account].status == Status.Member;
    }

    function memberCount() external view returns (uint256) {
        return _members.length;
    }

    function members() external view returns (address[] memory) {
        return _members;
    }

    function getNode(address account)
        external
        view
        returns (string memory name, string memory endpoint, bytes memory pubkey, bytes32 overlay, Status status)
    {
        Node storage node = _nodes[account];
        return (node.name, node.endpoint, node.pubkey, node.overlay, node.status);
    }

    /// A non-empty string of at most `limit` bytes, each in [lowest, 0x7e] (printable ASCII).
    function _requireText(string memory field, string calldata value, uint256 limit, uint8 lowest) private pure {
        bytes calldata raw = bytes(value);
        if (raw.length == 0) revert EmptyField(field);
        if (raw.length > limit) revert FieldTooLong(field, raw.length, limit);
        for (uint256 i; i < raw.length; ++i) {
            uint8 c = uint8(raw[i]);
            if (c < lowest || c > 0x7e) revert InvalidText(field, i);
        }
    }

    function _admit(address account, Node storage node) private {
        node.status = Status.Member;
        node.epoch += 1;
        node.removeVotes = 0;
        _members.push(account);
        _memberSlot[account] = _members.length;
        emit NodeAdmitted(account, _members.length);
    }

    function _drop(address account) private {
        Node storage node = _nodes[account];
        node.status = Status.None;
        node.epoch += 1;
        node.admitVotes = 0;
        node.removeVotes = 0;
        uint256 slot = _memberSlot[account];
        address last = _members[_members.length - 1];
        _members[slot - 1] = last;
        _memberSlot[last] = slot;
        _members.pop();
        delete _memberSlot[account];
    }
}
