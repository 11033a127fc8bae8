"""ChainClient: signs with this node's key, sends without duplicates, decodes reverts.

Retries and error translation live here, at the client edge (one decorator): connection errors
are retried with exponential backoff; a transaction is signed once and the same raw bytes are
resent, so a retry can never create a second transaction. "already known", or "nonce too low"
while our hash is on chain, count as success.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import requests
from eth_account.signers.local import LocalAccount
from eth_tester.exceptions import TransactionFailed as TesterTransactionFailed
from eth_typing import HexStr
from eth_utils import to_checksum_address
from eth_utils.exceptions import ValidationError as EthValidationError
from web3 import Web3
from web3.exceptions import (
    ContractLogicError,
    ProviderConnectionError,
    TimeExhausted,
    TransactionNotFound,
    Web3RPCError,
)
from web3.providers.eth_tester import EthereumTesterProvider
from web3.types import BlockIdentifier, FilterParams, TxParams

from .abi import ContractCall, EventDecoder, decode_result, encode_deploy
from .artifacts import Artifact
from .errors import (
    ChainUnavailable,
    ContractRevert,
    NonceConflict,
    TransactionRejected,
    TransactionTimeout,
    UnknownRevert,
    decode_revert,
)
from .nonces import NonceManager
from .resources import TxReceipt

T = TypeVar("T")

TRANSIENT = (
    requests.ConnectionError,
    requests.Timeout,
    ConnectionError,
    TimeoutError,
    ProviderConnectionError,
)
IN_PROCESS_GAS = 8_000_000
_ALREADY_KNOWN = ("already known", "known transaction", "already imported", "already in pool")
_HEAD_NOT_EXECUTED = ("state trie does not contain state root",)
_NONCE_TOO_LOW = ("nonce too low", "invalid transaction nonce", "nonce has already been used")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_delay: float = 0.1
    max_delay: float = 3.0

    def delays(self):
        for attempt in range(self.attempts - 1):
            yield min(self.max_delay, self.base_delay * 2**attempt)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TRANSIENT):
        return True
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return exc.response.status_code in (502, 503, 504)
    if isinstance(exc, Web3RPCError):
        # The EthereumJS client imports a block before it executes it: until then a call or an
        # estimate at "latest" finds no state for the head (a moment, on a validator chain).
        return any(text in str(exc).lower() for text in _HEAD_NOT_EXECUTED)
    return False


def with_retries(method: Callable[..., T]) -> Callable[..., T]:
    """Retry a read-only or idempotent RPC step on connection errors, with backoff."""

    @functools.wraps(method)
    def wrapper(self: ChainClient, *args: Any, **kwargs: Any) -> T:
        delays = self.retry.delays()
        while True:
            try:
                with self._rpc_lock:
                    return method(self, *args, **kwargs)
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                delay = next(delays, None)
                if delay is None:
                    raise ChainUnavailable(f"{method.__name__}: chain unreachable: {exc}") from exc
                time.sleep(delay)

    return wrapper


def revert_from(exc: BaseException) -> ContractRevert | None:
    """The typed revert inside a web3 / eth-tester exception, or None if it is not a revert."""
    if isinstance(exc, ContractLogicError) and exc.data is not None:
        data = exc.data
        if isinstance(data, str):
            return decode_revert(bytes.fromhex(data.removeprefix("0x")))
        if isinstance(data, bytes):
            return decode_revert(data)
    if isinstance(exc, ContractLogicError):
        return UnknownRevert(str(exc))
    if isinstance(exc, TesterTransactionFailed):
        # web3's tester provider re-raises with the data decoded as a string whatever the
        # selector; the raw bytes are on the original exception (its __context__).
        cause: BaseException | None = exc
        while cause is not None:
            raw = cause.args[0] if cause.args else None
            if isinstance(raw, Exception) and raw.args:
                raw = raw.args[0]
            if isinstance(raw, bytes):
                return decode_revert(raw)
            cause = cause.__context__
        message = str(exc.args[0]) if exc.args else ""
        prefix = "execution reverted: "
        if message.startswith(prefix + "b'") or message.startswith(prefix + 'b"'):
            return decode_revert(ast.literal_eval(message[len(prefix) :]))
        return UnknownRevert(message)
    return None


def _refuses_pending(exc: Web3RPCError) -> bool:
    """The node's answer to a "pending" block tag it does not serve (EthereumJS: '"pending" is
    not yet supported', invalid params)."""
    return "pending" in str(exc).lower() and "support" in str(exc).lower()


def _receipt_not_stored_yet(exc: Web3RPCError) -> bool:
    """The EthereumJS client between indexing a sealed block's receipts and storing the block:
    it answers an error ("value for 0x.. not found in DB") where it means "no receipt yet"."""
    return "not found in db" in str(exc).lower()


logger = logging.getLogger(__name__)

# How long a base fee read for one transaction is used for the next ones (see ChainClient._fees).
FEE_TTL_S = 1.0


class ChainClient:
    """Talks JSON-RPC for one account. Settings are passed in, never read here."""

    def __init__(
        self,
        w3: Web3,
        account: LocalAccount,
        *,
        nonce_lock_path: Path | None = None,
        retry: RetryPolicy | None = None,
        receipt_timeout: float = 120.0,
        poll_interval: float = 0.02,
        gas_margin: float = 1.25,
        priority_fee: int = 10**9,
        observer: Callable[[str, int | None, str], None] | None = None,
    ):
        self.w3 = w3
        # Told of every transaction's end: (function, gas used or None, mined|reverted|failed).
        self.observer = observer
        self.account = account
        self.address = account.address
        self.retry = retry or RetryPolicy()
        self.receipt_timeout = receipt_timeout
        self.poll_interval = poll_interval
        self.gas_margin = gas_margin
        self.priority_fee = priority_fee
        self.decoder = EventDecoder()
        self.nonces = NonceManager(nonce_lock_path)
        # py-evm is not thread-safe: one in-process chain serves one RPC at a time.
        self.in_process = isinstance(w3.provider, EthereumTesterProvider)
        self._rpc_lock: Any = threading.RLock() if self.in_process else contextlib.nullcontext()
        self._chain_id: int | None = None
        self._base_fee: tuple[float, int] | None = None  # (monotonic time read, wei)
        # The block tag this node estimates gas at (_estimate_on_node): "pending" (anvil, geth) or
        # "latest" (a node without the pending tag: the EthereumJS client); learnt once.
        self._estimation = "pending"

    # ---------------------------------------------------------------- reads

    @property
    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = self.read(lambda: self.w3.eth.chain_id)
        return self._chain_id

    @with_retries
    def read(self, fn: Callable[[], T]) -> T:
        """Run one read-only RPC step (a callable) with retries and error translation."""
        return fn()

    def client_version(self) -> str:
        return self.read(lambda: self.w3.client_version)

    def block_number(self) -> int:
        return self.read(lambda: self.w3.eth.block_number)

    def block_timestamp(self, block: BlockIdentifier = "latest") -> int:
        """The timestamp (seconds) of ``block``: a number, or "latest"."""
        return int(self.read(lambda: self.w3.eth.get_block(block)["timestamp"]))

    def gas_used(self, tx_hash: str) -> int | None:
        """The gas a mined transaction used, from its receipt (None: the chain has no receipt of it)."""
        try:
            raw = self.read(lambda: self.w3.eth.get_transaction_receipt(HexStr(tx_hash)))
        except TransactionNotFound:
            return None
        return int(raw["gasUsed"])

    def get_logs(self, addresses: list[str], from_block: int, to_block: int) -> list[Any]:
        query: FilterParams = {
            "address": [to_checksum_address(a) for a in addresses],
            "fromBlock": from_block,
            "toBlock": to_block,
        }
        return list(self.read(lambda: self.w3.eth.get_logs(query)))

    def has_code(self, address: str) -> bool:
        return len(self.read(lambda: self.w3.eth.get_code(to_checksum_address(address)))) > 0

    def balance(self, address: str | None = None) -> int:
        return self.read(lambda: self.w3.eth.get_balance(to_checksum_address(address or self.address)))

    def call(self, call: ContractCall, *, block: BlockIdentifier = "latest") -> tuple[Any, ...]:
        """eth_call from this account; a revert raises its typed ContractRevert."""
        tx: TxParams = {"from": self.address, "to": call.to, "data": call.data}
        try:
            raw = self.read(lambda: self.w3.eth.call(tx, block))
        except (ContractLogicError, TesterTransactionFailed) as exc:
            raise revert_from(exc) or UnknownRevert(str(exc)) from exc
        return decode_result(call, raw)

    # ---------------------------------------------------------------- writes

    def transact(self, call: ContractCall, *, gas: int | None = None, extra_gas: int = 0) -> TxReceipt:
        """Send a contract call as a signed transaction and wait for its receipt. ``extra_gas``:
        room above the estimate for a costlier path the call may take once mined (the state can
        change between the estimate and the block); unused gas is not charged."""
        try:
            receipt = self._send({"to": call.to, "data": call.data}, gas, extra_gas)
        except ContractRevert:
            self._observe(call.function, None, "reverted")
            raise
        except Exception:
            self._observe(call.function, None, "failed")
            raise
        self._observe(call.function, receipt.gas_used, "mined")
        return receipt

    def _observe(self, function: str, gas_used: int | None, outcome: str) -> None:
        if self.observer is not None:
            try:
                self.observer(function, gas_used, outcome)
            except Exception:  # counting must never fail a transaction
                logger.exception("transaction observer failed")

    def deploy(self, artifact: Artifact, *args: Any) -> TxReceipt:
        return self._send({"data": encode_deploy(artifact, args)}, None)

    def _send(self, fields: TxParams, gas: int | None, extra_gas: int = 0) -> TxReceipt:
        if gas is None:
            gas = self._estimate_gas(fields) + extra_gas
        with self.nonces.reserve(self._pending_nonce) as nonce:
            # eth-account takes the transaction as a plain dict (its own field types, not web3's).
            tx: dict[str, Any] = dict(
                fields, gas=gas, nonce=nonce, chainId=self.chain_id, value=0, **self._fees()
            )
            signed = self.account.sign_transaction(tx)
            tx_hash = self._send_raw(signed.raw_transaction, "0x" + bytes(signed.hash).hex())
        receipt = self._wait_receipt(tx_hash)
        if receipt.status != 1:
            raise self._failure(fields, receipt)
        return receipt

    def _estimate_gas(self, fields: TxParams) -> int:
        tx: TxParams = {**fields, "from": self.address}
        try:
            if self.in_process:
                # eth-tester estimates by bisection (many executions); one eth_call finds any
                # revert, and the in-process chain's gas is free, so send with a fixed limit.
                self.read(lambda: self.w3.eth.call(tx, "pending"))
                return IN_PROCESS_GAS
            # Against the pending block, which is what the transaction will see once mined: the
            # latest block of an idle chain (anvil mines only on a transaction) carries a stale
            # timestamp, so a call that is valid only past a deadline (finalizeRound once a
            # trainer died) would fail to estimate forever, and nothing would mine a new block.
            estimate = self._estimate_on_node(tx)
        except (ContractLogicError, TesterTransactionFailed) as exc:
            raise revert_from(exc) or UnknownRevert(str(exc)) from exc
        except Web3RPCError as exc:
            raise TransactionRejected(f"gas estimation failed: {exc}") from exc
        return int(estimate * self.gas_margin) + 10_000

    def _estimate_on_node(self, tx: TxParams) -> int:
        """eth_estimateGas as far as the node serves it, learnt from its first refusal.

        A node without the "pending" tag (the EthereumJS client) estimates against the latest
        block: a chain that seals a block every period (Clique) has one at most a period old.
        """
        if self._estimation == "pending":
            try:
                return self.read(lambda: self.w3.eth.estimate_gas(tx, "pending"))
            except Web3RPCError as exc:
                if not _refuses_pending(exc):
                    raise
                self._estimation = "latest"
        return self.read(lambda: self.w3.eth.estimate_gas(tx, "latest"))

    def _pending_nonce(self) -> int:
        return self.read(lambda: self.w3.eth.get_transaction_count(self.address, "pending"))

    def _fees(self) -> dict[str, int]:
        # The fee cap is twice the base fee: it survives the base fee doubling, which takes six
        # or more full blocks (EIP-1559 raises it at most 12.5% a block). So a base fee read up
        # to FEE_TTL_S ago is as good as a fresh one, and a node sending several transactions
        # in a round saves a request on each.
        now = time.monotonic()
        if self._base_fee is None or now - self._base_fee[0] > FEE_TTL_S:
            base = self.read(lambda: self.w3.eth.get_block("latest")).get("baseFeePerGas") or 0
            self._base_fee = (now, int(base))
        base = self._base_fee[1]
        return {"maxFeePerGas": 2 * base + self.priority_fee, "maxPriorityFeePerGas": self.priority_fee}

    def _send_raw(self, raw: bytes, tx_hash: str) -> str:
        delays = self.retry.delays()
        while True:
            try:
                with self._rpc_lock:
                    self.w3.eth.send_raw_transaction(raw)
                return tx_hash
            except Exception as exc:
                if _is_transient(exc):
                    delay = next(delays, None)
                    if delay is None:
                        raise ChainUnavailable(f"could not send {tx_hash}: {exc}") from exc
                    time.sleep(delay)
                    continue
                message = str(exc).lower()
                if any(text in message for text in _ALREADY_KNOWN):
                    return tx_hash  # an earlier attempt reached the node
                if any(text in message for text in _NONCE_TOO_LOW) and self._known(tx_hash):
                    return tx_hash  # an earlier attempt was mined already
                if any(text in message for text in _NONCE_TOO_LOW):
                    raise NonceConflict(f"nonce of {tx_hash} used by another transaction: {exc}") from exc
                if isinstance(exc, Web3RPCError | ValueError | EthValidationError):
                    raise TransactionRejected(f"transaction {tx_hash} rejected: {exc}") from exc
                raise

    def _known(self, tx_hash: str) -> bool:
        try:
            self.read(lambda: self.w3.eth.get_transaction(HexStr(tx_hash)))
        except TransactionNotFound:
            return False
        return True

    def _wait_receipt(self, tx_hash: str) -> TxReceipt:
        deadline = time.monotonic() + self.receipt_timeout
        while True:
            try:
                raw = self.read(lambda: self.w3.eth.get_transaction_receipt(HexStr(tx_hash)))
                return self._receipt(raw)
            except (TransactionNotFound, TimeExhausted, Web3RPCError) as exc:
                if not isinstance(exc, TransactionNotFound | TimeExhausted) and not _receipt_not_stored_yet(
                    exc
                ):
                    raise
                if time.monotonic() > deadline:
                    raise TransactionTimeout(
                        f"no receipt for {tx_hash} after {self.receipt_timeout}s"
                    ) from None
                time.sleep(self.poll_interval)

    def _receipt(self, raw: Any) -> TxReceipt:
        events = tuple(e for e in (self.decoder.decode(log) for log in raw["logs"]) if e is not None)
        address = raw.get("contractAddress")
        return TxReceipt(
            tx_hash="0x" + bytes(raw["transactionHash"]).hex(),
            block_number=int(raw["blockNumber"]),
            gas_used=int(raw["gasUsed"]),
            status=int(raw["status"]),
            contract_address=to_checksum_address(address) if address else None,
            events=events,
        )

    def _failure(self, fields: TxParams, receipt: TxReceipt) -> Exception:
        """Replay a mined-but-reverted transaction at its block to name the error."""
        tx: TxParams = {**fields, "from": self.address}
        try:
            self.read(lambda: self.w3.eth.call(tx, receipt.block_number - 1))
        except (ContractLogicError, TesterTransactionFailed) as exc:
            return revert_from(exc) or UnknownRevert(str(exc))
        return UnknownRevert(f"transaction {receipt.tx_hash} reverted (out of gas?)")
