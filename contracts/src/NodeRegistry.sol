// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import "./Errors.sol";
import {INodeRegistry, IPreviousNodeRegistry, IImportPart} from "./INodeRegistry.sol";

/// @title NodeRegistry: the consortium of DeFL nodes.
/// @notice A node is its chain address with a name, an endpoint URL, its secp256k1 public key
/// (64 bytes, uncompressed without the 0x04 prefix; used for ECIES) and its swarm overlay address.
/// A node applies with `registerNode`; the members admit it by vote (`voteAdmission`) once
/// `votes * 100 >= members * thresholdPercent`. While the consortium has fewer than two members
/// the deployer's vote alone admits (bootstrap). Members update their endpoint, leave, and remove
/// a member by the same vote threshold. Votes are per application / removal attempt (epoch), and
/// a vote counts only while its voter is a member: every vote recounts the voters who still are, so
/// a member removed (or gone) after voting no longer carries an admission or a removal.
/// Names (at most 64 bytes) and endpoints (at most 256 bytes) are printable ASCII, an endpoint
/// without spaces: every node mirrors them, so no one can register a string it cannot store.
///
/// A new contract version carries a consortium over (docs/OPERATIONS.md, Upgrades): deployed with
/// its `predecessor` (the previous NodeRegistry; zero for a fresh consortium), it opens an import.
/// Anyone may call `importMembers`: it copies accounts that are members of the predecessor, read
/// through the predecessor's views (so nobody can import what the chain does not say), and drops
/// those imported that no longer are. While the import is open the registry takes no other write
/// and `isMember` is false for everyone, so no job, dataset, vote or registration can use a
/// consortium that is still being copied. The imported members close it with `confirmImport`, by
/// the admission threshold; a confirmation is accepted only while the import is complete: every
/// member of the predecessor imported, none but them, and the wired DataRegistry's datasets all
/// carried (`wireDataImport`). So a hostile member cannot close a partial import: the most it can
/// do is confirm early, which counts for nothing until the copy is whole.
contract NodeRegistry is INodeRegistry {
    uint16 public constant PROTOCOL_VERSION = 2;
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
    IPreviousNodeRegistry public immutable predecessor; // zero: a fresh consortium, nothing to import
    IImportPart public dataImport; // the DataRegistry whose import closes with this one's
    bool public importConfirmed;

    mapping(address => Node) private _nodes;
    mapping(bytes32 => bool) private _voted; // keccak(kind, node, epoch, voter)
    mapping(bytes32 => address[]) private _voters; // keccak(kind, node, epoch) => who voted
    address[] private _members;
    mapping(address => uint256) private _memberSlot; // index + 1 in _members

    event NodeApplied(address indexed node, string name, string endpoint, bytes pubkey, bytes32 overlay);
    event AdmissionVoted(address indexed node, address indexed voter, uint32 votes, uint32 needed);
    event NodeAdmitted(address indexed node, uint256 memberCount);
    event EndpointUpdated(address indexed node, string endpoint);
    event NodeLeft(address indexed node, uint256 memberCount);
    event RemovalVoted(address indexed node, address indexed voter, uint32 votes, uint32 needed);
    event NodeRemoved(address indexed node, uint256 memberCount);
    event DataImportWired(address dataImport);
    event ImportConfirmVoted(address indexed voter, uint32 votes, uint32 needed);
    event ImportClosed(uint256 memberCount);

    constructor(uint8 thresholdPercent_, IPreviousNodeRegistry predecessor_) {
        if (thresholdPercent_ == 0 || thresholdPercent_ > 100) revert EmptyField("thresholdPercent");
        deployer = msg.sender;
        thresholdPercent = thresholdPercent_;
        predecessor = predecessor_;
    }

    modifier onlyMember() {
        _requireImportClosed();
        if (_nodes[msg.sender].status != Status.Member) revert NotMember(msg.sender);
        _;
    }

    /// @notice True while the predecessor's members are being imported (until they confirm).
    function importOpen() public view returns (bool) {
        return address(predecessor) != address(0) && !importConfirmed;
    }

    /// @notice Names the DataRegistry whose dataset import must be complete before this import
    /// closes; once, by the deployer, while the import is open. The members check it before they
    /// confirm (`manage.py ledger confirm-import` does).
    function wireDataImport(IImportPart dataImport_) external {
        if (msg.sender != deployer) revert Unauthorized(msg.sender);
        if (!importOpen()) revert ImportNotOpen();
        if (address(dataImport) != address(0)) revert AlreadyWired(address(dataImport));
        if (address(dataImport_).code.length == 0 || address(dataImport_.registry()) != address(this)) {
            revert InvalidDataset("dataImport");
        }
        dataImport = dataImport_;
        emit DataImportWired(address(dataImport_));
    }

    /// @notice Makes each account's membership here what the predecessor says now: a member there
    /// is copied (name, endpoint, public key, overlay; a re-import takes its current endpoint), an
    /// account imported that is no longer a member there is dropped. Anyone may call it while the
    /// import is open; the data comes from the predecessor's views.
    function importMembers(address[] calldata accounts) external {
        if (!importOpen()) revert ImportNotOpen();
        for (uint256 i; i < accounts.length; ++i) {
            address account = accounts[i];
            Node storage node = _nodes[account];
            if (!predecessor.isMember(account)) {
                if (node.status == Status.Member) {
                    _drop(account);
                    emit NodeRemoved(account, _members.length);
                }
                continue;
            }
            (string memory name, string memory endpoint, bytes memory pubkey, bytes32 overlay,) =
                predecessor.getNode(account);
            _requireText("endpoint", bytes(endpoint), MAX_ENDPOINT, 0x21);
            if (node.status == Status.Member) {
                if (keccak256(bytes(endpoint)) != keccak256(bytes(node.endpoint))) {
                    node.endpoint = endpoint;
                    emit EndpointUpdated(account, endpoint);
                }
                continue;
            }
            _requireText("name", bytes(name), MAX_NAME, 0x20);
            if (pubkey.length != 64 || address(uint160(uint256(keccak256(pubkey)))) != account) {
                revert InvalidPublicKey(account);
            }
            node.name = name;
            node.endpoint = endpoint;
            node.pubkey = pubkey;
            node.overlay = overlay;
            // the same events as an application and an admission: every node's mirror learns them
            emit NodeApplied(account, name, endpoint, pubkey, overlay);
            _admit(account, node);
        }
    }

    /// @notice An imported member confirms the import; the confirmation that reaches the admission
    /// threshold (of the imported members) closes it for good. Refused while the import is not
    /// complete: every predecessor member imported and no one else, every dataset carried.
    function confirmImport() external {
        if (!importOpen()) revert ImportNotOpen();
        if (_nodes[msg.sender].status != Status.Member) revert NotMember(msg.sender);
        if (!membersComplete()) revert ImportIncomplete("members");
        if (address(dataImport) == address(0) || !dataImport.importComplete()) revert ImportIncomplete("datasets");
        uint32 votes = _vote(3, address(0), 0);
        uint32 needed = votesNeeded();
        emit ImportConfirmVoted(msg.sender, votes, needed);
        if (votes >= needed) {
            importConfirmed = true;
            emit ImportClosed(_members.length);
        }
    }

    /// @notice Every member of the predecessor is a member here, and no one else is.
    function membersComplete() public view returns (bool) {
        address[] memory theirs = predecessor.members();
        if (theirs.length != _members.length) return false;
        for (uint256 i; i < theirs.length; ++i) {
            if (_nodes[theirs[i]].status != Status.Member) return false;
        }
        return true;
    }

    /// @notice Apply for membership; the deployer is admitted at once while there are < 2 members.
    function registerNode(string calldata name, string calldata endpoint, bytes calldata pubkey, bytes32 overlay)
        external
    {
        _requireImportClosed();
        Node storage node = _nodes[msg.sender];
        if (node.status == Status.Member) revert AlreadyMember(msg.sender);
        if (node.status == Status.Applied) revert AlreadyApplied(msg.sender);
        _requireText("name", bytes(name), MAX_NAME, 0x20);
        _requireText("endpoint", bytes(endpoint), MAX_ENDPOINT, 0x21);
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
        if (_bootstrapping()) _admit(msg.sender, node);
    }

    /// @notice A member's vote (or the deployer's, during bootstrap) to admit an applicant.
    function voteAdmission(address applicant) external {
        _requireImportClosed();
        Node storage node = _nodes[applicant];
        if (node.status != Status.Applied) revert NotApplicant(applicant);
        if (_bootstrapping()) {
            emit AdmissionVoted(applicant, msg.sender, 1, 1);
            _admit(applicant, node);
            return;
        }
        if (_nodes[msg.sender].status != Status.Member) revert NotMember(msg.sender);
        uint32 votes = _vote(1, applicant, node.epoch);
        node.admitVotes = votes;
        uint32 needed = votesNeeded();
        emit AdmissionVoted(applicant, msg.sender, votes, needed);
        if (votes >= needed) _admit(applicant, node);
    }

    function updateEndpoint(string calldata endpoint) external onlyMember {
        _requireText("endpoint", bytes(endpoint), MAX_ENDPOINT, 0x21);
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
        uint32 votes = _vote(2, member, node.epoch);
        node.removeVotes = votes;
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

    /// @notice A member that may act: false for everyone while an import is open.
    function isMember(address account) external view returns (bool) {
        return _nodes[account].status == Status.Member && !importOpen();
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

    /// Records msg.sender's vote of `kind` (1 admit, 2 remove, 3 close the import) on `node` in `epoch`, once, and
    /// returns the votes that count now: those of voters who are members at this moment.
    function _vote(uint8 kind, address node, uint32 epoch) private returns (uint32 votes) {
        bytes32 key = keccak256(abi.encode(kind, node, epoch, msg.sender));
        if (_voted[key]) revert AlreadyVoted(msg.sender);
        _voted[key] = true;
        address[] storage voters = _voters[keccak256(abi.encode(kind, node, epoch))];
        voters.push(msg.sender);
        for (uint256 i; i < voters.length; ++i) {
            if (_nodes[voters[i]].status == Status.Member) ++votes;
        }
    }

    /// The deployer alone admits while a fresh consortium has fewer than two members (never in an
    /// upgrade: the members come from the predecessor).
    function _bootstrapping() private view returns (bool) {
        return msg.sender == deployer && _members.length < 2 && address(predecessor) == address(0);
    }

    function _requireImportClosed() private view {
        if (importOpen()) revert ImportOpen();
    }

    /// A non-empty string of at most `limit` bytes, each in [lowest, 0x7e] (printable ASCII).
    function _requireText(string memory field, bytes memory raw, uint256 limit, uint8 lowest) private pure {
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
