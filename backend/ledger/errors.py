"""One exception family for the ledger, and the one table that turns revert data into it.

Custom errors of the contracts (contracts/src/Errors.sol) decode to typed subclasses of
``ContractRevert``; ``decode_revert`` is pure, so both chains and the tests share it.
"""

from __future__ import annotations

from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import function_signature_to_4byte_selector, to_checksum_address

from .artifacts import all_artifacts


class LedgerError(Exception):
    """Anything that went wrong talking to the chain.

    ``http_status``: what the error means to an API caller (a plain int: the ledger does not know
    DRF; backend/api/exception_handler.py reads it). A revert conflicts with the chain's state
    (409); a chain that cannot be reached or used now is 503.
    """

    http_status = 409


class LedgerConfigError(LedgerError):
    """The ledger is not configured or its contracts are not deployed on this chain."""

    http_status = 503


class ChainUnavailable(LedgerError):
    """The chain's RPC endpoint could not be reached after all retries."""

    http_status = 503


class TransactionRejected(LedgerError):
    """The node refused the transaction (fee, balance, nonce) before it was mined."""


class NonceConflict(TransactionRejected):
    """Our nonce was used by another transaction: a second sender with the same key?"""


class TransactionTimeout(LedgerError):
    """The transaction was sent but no receipt arrived in time."""

    http_status = 503


class ContractRevert(LedgerError):
    """The contract refused the call. ``error`` is the Solidity error name, ``args`` its arguments."""

    def __init__(self, message: str, args: dict[str, Any] | None = None, data: bytes = b""):
        super().__init__(message)
        self.args_ = dict(args or {})
        self.data = data

    @property
    def error(self) -> str:
        return type(self).__name__


class RevertedWithReason(ContractRevert):
    """require(condition, "reason") or revert("reason")."""

    error = "Error"


class Panic(ContractRevert):
    """An assertion, overflow or out-of-bounds access (Panic(uint256))."""

    error = "Panic"


class UnknownRevert(ContractRevert):
    """Revert data with a selector that no artifact declares (or no data at all)."""


class NotMember(ContractRevert):
    """The account is not a member of the consortium."""


class AlreadyMember(ContractRevert):
    """The account is a member already."""


class AlreadyApplied(ContractRevert):
    """The account has applied already."""


class NotApplicant(ContractRevert):
    """The account has not applied for membership."""


class AlreadyVoted(ContractRevert):
    """This account has voted already."""


class InvalidPublicKey(ContractRevert):
    """The public key is not 64 bytes or does not belong to the sender."""


class EmptyField(ContractRevert):
    """A required field is empty."""


class FieldTooLong(ContractRevert):
    """A string or bytes field is longer than the contract accepts."""


class InvalidText(ContractRevert):
    """A name or endpoint holds a byte outside printable ASCII."""


class UnknownJob(ContractRevert):
    """No job with this id."""


class NotJobProposer(ContractRevert):
    """Only the job's proposer may do this."""


class InvalidJobSpec(ContractRevert):
    """The job specification is invalid."""


class JobNotOpen(ContractRevert):
    """The job is not open for joining."""


class JobNotRunning(ContractRevert):
    """The job is not running."""


class JobIsCancelled(ContractRevert):
    """The job was cancelled."""


class DeadlinePassed(ContractRevert):
    """The deadline has passed."""


class AlreadyJoined(ContractRevert):
    """The node has joined this job already."""


class NotParticipant(ContractRevert):
    """The node has not joined this job."""


class NotEnoughParticipants(ContractRevert):
    """Too few participants to start."""


class TooManyParticipants(ContractRevert):
    """The job is full."""


class WrongRound(ContractRevert):
    """The call names another round than the current one."""


class WrongPhase(ContractRevert):
    """The round is not in the phase this call needs."""


class CommitteeCannotTrain(ContractRevert):
    """Committee members do not submit updates in their round."""


class DuplicateUpdate(ContractRevert):
    """This trainer submitted an update in this round already."""


class NotCommitted(ContractRevert):
    """A reveal from a member that did not commit to scores this round."""


class RevealNotOpen(ContractRevert):
    """Members may still commit: reveals open once all committed or the commit deadline passed."""


class CommitmentMismatch(ContractRevert):
    """The revealed scores (or salt) are not the ones committed to."""


class AggregationNotOverdue(ContractRevert):
    """The round's aggregation deadline has not passed: it cannot be skipped yet."""


class DuplicateContent(ContractRevert):
    """Another trainer submitted an update with this content hash in this round already (a copy)."""


class NotCommitteeMember(ContractRevert):
    """The sender is not on the committee for this step."""


class DuplicateScores(ContractRevert):
    """This member scored this round (or this update) already."""


class UnknownUpdate(ContractRevert):
    """No update from this trainer in this round."""


class ScoreOutOfRange(ContractRevert):
    """Scores are integers in [0, 10000]."""


class LengthMismatch(ContractRevert):
    """List lengths differ."""


class ScoringNotOpen(ContractRevert):
    """Updates are still coming in and the training deadline has not passed."""


class RoundNotFinalizable(ContractRevert):
    """Scores are missing and the scoring deadline has not passed."""


class InvalidReference(ContractRevert):
    """A swarm reference is 32 or 64 bytes."""


class InvalidUpdate(ContractRevert):
    """The update is invalid."""


class SamplesAboveDataset(ContractRevert):
    """An update names more samples than the trainer's dataset has registered."""


class SpendMissing(ContractRevert):
    """A job with DP needs the trainer's privacy spend for the round before its update."""


class SpendOutOfBounds(ContractRevert):
    """The spend is zero or above the job's planned bound per release (0: a job without DP)."""


class TooManySpends(ContractRevert):
    """This participant recorded the most spends a round allows (MAX_SPENDS_PER_ROUND)."""


class DrawNotOpen(ContractRevert):
    """The job is not waiting for draw secrets (not started, or its committee is drawn)."""


class DrawSecretMismatch(ContractRevert):
    """The revealed draw secret is not the one committed at join."""


class AlreadyRevealed(ContractRevert):
    """This participant revealed its draw secret already."""


class NotDrawn(ContractRevert):
    """The participant did not reveal its draw secret in time (or never joined): it takes no part."""


class DrawNotOverdue(ContractRevert):
    """The draw secrets' reveal deadline has not passed: the draw waits for them."""


class UnknownDataset(ContractRevert):
    """No dataset with this id."""


class NotDatasetOwner(ContractRevert):
    """Only the dataset's owner may do this."""


class NotGranted(ContractRevert):
    """The account has no grant on this dataset."""


class DatasetNotUsable(ContractRevert):
    """The node neither owns nor was granted this dataset."""


class PrivacyBudgetExceeded(ContractRevert):
    """The spend would pass the dataset's privacy cap."""


class InvalidDataset(ContractRevert):
    """The dataset record is invalid."""


class DuplicateDataset(ContractRevert):
    """This commitment is registered already, as the dataset ``existingId``."""


class GrantRevoked(ContractRevert):
    """The grantee's grant on the dataset ended: its jobs release nothing more from it."""


class ImportOpen(ContractRevert):
    """The registry still imports its predecessor's state: it takes no other write until its
    imported members confirm the import (docs/OPERATIONS.md, Upgrades)."""


class ImportNotOpen(ContractRevert):
    """No import of a predecessor's state is open (none was, or the members closed it)."""


class ImportIncomplete(ContractRevert):
    """The predecessor's members or datasets are not all carried over yet: the import cannot close."""


class Unauthorized(ContractRevert):
    """Only the wired contract (or the deployer) may call this."""


class AlreadyWired(ContractRevert):
    """The spender contract is set already."""


# The one table: Solidity error name -> exception. Every custom error in the artifacts must be here
# (tests/ledger/test_errors.py checks it); selectors are computed from the artifacts' ABIs.
ERROR_TYPES: dict[str, type[ContractRevert]] = {
    "NotMember": NotMember,
    "AlreadyMember": AlreadyMember,
    "AlreadyApplied": AlreadyApplied,
    "NotApplicant": NotApplicant,
    "AlreadyVoted": AlreadyVoted,
    "InvalidPublicKey": InvalidPublicKey,
    "EmptyField": EmptyField,
    "FieldTooLong": FieldTooLong,
    "InvalidText": InvalidText,
    "UnknownJob": UnknownJob,
    "NotJobProposer": NotJobProposer,
    "InvalidJobSpec": InvalidJobSpec,
    "JobNotOpen": JobNotOpen,
    "JobNotRunning": JobNotRunning,
    "JobIsCancelled": JobIsCancelled,
    "DeadlinePassed": DeadlinePassed,
    "AlreadyJoined": AlreadyJoined,
    "NotParticipant": NotParticipant,
    "NotEnoughParticipants": NotEnoughParticipants,
    "TooManyParticipants": TooManyParticipants,
    "WrongRound": WrongRound,
    "WrongPhase": WrongPhase,
    "CommitteeCannotTrain": CommitteeCannotTrain,
    "DuplicateUpdate": DuplicateUpdate,
    "DuplicateContent": DuplicateContent,
    "AggregationNotOverdue": AggregationNotOverdue,
    "NotCommitted": NotCommitted,
    "RevealNotOpen": RevealNotOpen,
    "CommitmentMismatch": CommitmentMismatch,
    "NotCommitteeMember": NotCommitteeMember,
    "DuplicateScores": DuplicateScores,
    "UnknownUpdate": UnknownUpdate,
    "ScoreOutOfRange": ScoreOutOfRange,
    "LengthMismatch": LengthMismatch,
    "ScoringNotOpen": ScoringNotOpen,
    "RoundNotFinalizable": RoundNotFinalizable,
    "InvalidReference": InvalidReference,
    "InvalidUpdate": InvalidUpdate,
    "SamplesAboveDataset": SamplesAboveDataset,
    "SpendMissing": SpendMissing,
    "SpendOutOfBounds": SpendOutOfBounds,
    "TooManySpends": TooManySpends,
    "DrawNotOpen": DrawNotOpen,
    "DrawSecretMismatch": DrawSecretMismatch,
    "AlreadyRevealed": AlreadyRevealed,
    "NotDrawn": NotDrawn,
    "DrawNotOverdue": DrawNotOverdue,
    "UnknownDataset": UnknownDataset,
    "NotDatasetOwner": NotDatasetOwner,
    "NotGranted": NotGranted,
    "DatasetNotUsable": DatasetNotUsable,
    "PrivacyBudgetExceeded": PrivacyBudgetExceeded,
    "InvalidDataset": InvalidDataset,
    "DuplicateDataset": DuplicateDataset,
    "GrantRevoked": GrantRevoked,
    "ImportOpen": ImportOpen,
    "ImportNotOpen": ImportNotOpen,
    "ImportIncomplete": ImportIncomplete,
    "Unauthorized": Unauthorized,
    "AlreadyWired": AlreadyWired,
}


class _ErrorSpec:
    __slots__ = ("name", "names", "types")

    def __init__(self, name: str, names: list[str], types: list[str]):
        self.name, self.names, self.types = name, names, types


def _selector_table() -> dict[bytes, _ErrorSpec]:
    table = {
        bytes.fromhex("08c379a0"): _ErrorSpec("Error", ["reason"], ["string"]),
        bytes.fromhex("4e487b71"): _ErrorSpec("Panic", ["code"], ["uint256"]),
    }
    for artifact in all_artifacts():
        for item in artifact.abi:
            if item["type"] != "error":
                continue
            types = [i["type"] for i in item["inputs"]]
            selector = function_signature_to_4byte_selector(f"{item['name']}({','.join(types)})")
            table[selector] = _ErrorSpec(item["name"], [i["name"] for i in item["inputs"]], types)
    return table


SELECTORS = _selector_table()


def _jsonable(value: Any, abi_type: str) -> Any:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return to_checksum_address(value) if abi_type == "address" else value


def decode_revert(data: bytes) -> ContractRevert:
    """Turn revert data (selector + ABI-encoded arguments) into a typed exception."""
    spec = SELECTORS.get(bytes(data[:4]))
    if spec is None:
        return UnknownRevert(f"reverted without a known error (data 0x{bytes(data).hex()})", data=bytes(data))
    try:
        values = abi_decode(spec.types, bytes(data[4:]))
    except Exception:  # malformed arguments: still name the error
        values = ()
    args = {n: _jsonable(v, t) for n, t, v in zip(spec.names, spec.types, values, strict=False)}
    if spec.name == "Error":
        return RevertedWithReason(f"reverted: {args.get('reason', '')}", args, bytes(data))
    if spec.name == "Panic":
        return Panic(f"panic 0x{args.get('code', 0):02x}", args, bytes(data))
    cls = ERROR_TYPES.get(spec.name, UnknownRevert)
    shown = ", ".join(f"{k}={v}" for k, v in args.items())
    return cls(f"{spec.name}({shown}): {cls.__doc__}", args, bytes(data))
