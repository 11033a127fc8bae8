// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

// Every rule of the DeFL contracts refuses with one of these named errors.
// backend/ledger/errors.py maps each 4-byte selector to a typed Python exception.

// --- membership (NodeRegistry, and every contract that needs a member) ---
error NotMember(address account);
error AlreadyMember(address account);
error AlreadyApplied(address account);
error NotApplicant(address account);
error AlreadyVoted(address voter);
error InvalidPublicKey(address account);
error EmptyField(string field);
error FieldTooLong(string field, uint256 length, uint256 limit);
error InvalidText(string field, uint256 position); // a byte outside printable ASCII

// --- jobs and rounds (FederatedLearning) ---
error UnknownJob(uint256 jobId);
error NotJobProposer(uint256 jobId, address account);
error InvalidJobSpec(string reason);
error JobNotOpen(uint256 jobId);
error JobNotRunning(uint256 jobId);
error JobIsCancelled(uint256 jobId);
error DeadlinePassed(uint64 deadline, uint64 current);
error AlreadyJoined(uint256 jobId, address account);
error NotParticipant(uint256 jobId, address account);
error NotEnoughParticipants(uint256 have, uint256 need);
error TooManyParticipants(uint256 limit);
error WrongRound(uint16 current, uint16 given);
error WrongPhase(uint256 jobId);
error CommitteeCannotTrain(address account);
error DuplicateUpdate(address trainer);
error DuplicateContent(bytes32 contentHash, address firstTrainer); // a copied update
error NotCommitteeMember(address account);
error DuplicateScores(address member);
error UnknownUpdate(address trainer);
error ScoreOutOfRange(uint256 score);
error LengthMismatch(uint256 expected, uint256 given);
error ScoringNotOpen(uint256 jobId);
error RoundNotFinalizable(uint256 jobId);
error AggregationNotOverdue(uint64 deadline, uint64 current);
error NotCommitted(address member); // a reveal without a commitment this round
error RevealNotOpen(uint256 jobId); // members may still commit
error CommitmentMismatch(address member); // the revealed scores are not the committed ones
error InvalidReference(uint256 length);
error InvalidUpdate(string reason);
error SamplesAboveDataset(uint64 samples, uint64 registered);
error SpendMissing(uint256 jobId, uint16 round, address trainer);
error SpendOutOfBounds(uint256 jobId, uint64 amount, uint64 bound);
error TooManySpends(uint256 jobId, uint16 round, address participant);
error DrawNotOpen(uint256 jobId); // no committee draw is waiting for reveals
error DrawSecretMismatch(address account); // the revealed secret is not the one committed at join
error AlreadyRevealed(address account);
error NotDrawn(address account); // a participant that did not reveal its draw secret in time
error DrawNotOverdue(uint64 deadline, uint64 current);

// --- datasets (DataRegistry) ---
error UnknownDataset(uint256 datasetId);
error NotDatasetOwner(uint256 datasetId, address account);
error NotGranted(uint256 datasetId, address account);
error DatasetNotUsable(uint256 datasetId, address account);
error PrivacyBudgetExceeded(uint256 datasetId, uint64 spent, uint64 requested, uint64 cap);
error InvalidDataset(string reason);
error DuplicateDataset(bytes32 commitment, uint256 existingId);
error GrantRevoked(uint256 datasetId, address grantee);

// --- carrying a predecessor's state over (NodeRegistry and DataRegistry of a new version) ---
error ImportOpen(); // the registry still imports its predecessor's state: the members have not confirmed it
error ImportNotOpen(); // no import is open (none was, or the members closed it)
error ImportIncomplete(string what); // "members" or "datasets" of the predecessor are not all carried yet

// --- wiring (set once at deployment) ---
error Unauthorized(address account);
error AlreadyWired(address spender);
