"""What a hostile party does on the chain, as plain functions (shared by the hostile-* tests).

- ``send_raw``: a transaction signed with the attacker's own key and sent as raw bytes, with a
  fixed gas limit: nothing of ours (no ChainClient preflight, no typed encoder) filters it, so
  whatever the contract accepts is mined and its events reach every node's indexer.
- ``encode_raw``: calldata for a function whose ``string`` arguments are given as arbitrary
  bytes (invalid UTF-8, megabytes): the ABI encodes string and bytes alike.
- ``craft_log``: the log a contract would emit for given arguments, for values the contract
  refuses today (fed straight to ``EventIndexer.store_logs``, as a contract that accepted them,
  or an older deployment, would deliver them).
"""

from __future__ import annotations

import secrets
from typing import Any

from eth_abi import encode as abi_encode
from eth_account.signers.local import LocalAccount
from eth_utils import event_abi_to_log_topic, function_abi_to_4byte_selector, get_abi_input_types
from web3 import Web3

from backend.ledger.artifacts import load_artifact
from backend.ledger.resources import Deployment

RAW_GAS = 6_000_000


def _as_bytes_types(types: list[str], values: list[Any]) -> list[str]:
    """Encode a ``string`` given as bytes with the ``bytes`` encoder (identical layout)."""
    return [
        "bytes" if t == "string" and isinstance(v, bytes) else t for t, v in zip(types, values, strict=True)
    ]


def _abi_item(contract: str, kind: str, name: str) -> dict[str, Any]:
    artifact = load_artifact(contract)
    return next(item for item in artifact.abi if item["type"] == kind and item.get("name") == name)


def has_function(contract: str, function: str) -> bool:
    return any(i["type"] == "function" and i["name"] == function for i in load_artifact(contract).abi)


def encode_raw(contract: str, function: str, **given: Any) -> bytes:
    """Calldata by argument name; arguments not given are zero (the signature may grow)."""
    fn = _abi_item(contract, "function", function)
    _known(fn, given, f"{contract}.{function}")
    args = [given[i["name"]] if i["name"] in given else _zero(i) for i in fn["inputs"]]
    types = get_abi_input_types(fn)
    return function_abi_to_4byte_selector(fn) + abi_encode(_as_bytes_types(types, args), args)


def send_raw(w3: Web3, account: LocalAccount, to: str, data: bytes, *, gas: int = RAW_GAS) -> dict:
    """Sign and send; the receipt (status 0: the contract refused it, and it emitted nothing)."""
    base = w3.eth.get_block("latest").get("baseFeePerGas") or 0
    tx = {
        "to": to,
        "data": data,
        "gas": gas,
        "nonce": w3.eth.get_transaction_count(account.address, "pending"),
        "chainId": w3.eth.chain_id,
        "value": 0,
        "maxFeePerGas": 2 * base + 10**9,
        "maxPriorityFeePerGas": 10**9,
    }
    signed = account.sign_transaction(tx)
    try:
        tx_hash = w3.eth.send_raw_transaction(signed.raw_transaction)
    except Exception as exc:  # the in-process EVM refuses a reverting transaction at once
        if "revert" not in str(exc).lower() and "TransactionFailed" not in type(exc).__name__:
            raise
        return {"status": 0, "logs": [], "error": str(exc)}
    return dict(w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60))


def craft_log(
    deployment: Deployment,
    contract: str,
    event: str,
    args: dict[str, Any],
    *,
    block: int,
    log_index: int = 0,
    tx_hash: str | None = None,
) -> dict[str, Any]:
    """The log ``contract`` would emit as ``event`` with ``args`` (strings may be bytes)."""
    item = _abi_item(contract, "event", event)
    indexed = [i for i in item["inputs"] if i["indexed"]]
    plain = [i for i in item["inputs"] if not i["indexed"]]
    topics = [event_abi_to_log_topic(item)] + [abi_encode([i["type"]], [args[i["name"]]]) for i in indexed]
    types = get_abi_input_types({"inputs": plain, "type": "event"})
    values = [args[i["name"]] for i in plain]
    return {
        "address": deployment.address(contract),
        "topics": topics,
        "data": abi_encode(_as_bytes_types(types, values), values),
        "blockNumber": block,
        "logIndex": log_index,
        "transactionHash": tx_hash or "0x" + secrets.token_hex(32),
    }


def event_args(contract: str, event: str, **given: Any) -> dict[str, Any]:
    """Arguments for ``event``: ``given`` ones, zero values of the right type for the rest (so a
    crafted log follows the event's current signature even when a contract adds arguments)."""
    item = _abi_item(contract, "event", event)
    _known(item, given, f"{contract}.{event}")
    return {i["name"]: given[i["name"]] if i["name"] in given else _zero(i) for i in item["inputs"]}


def _known(item: dict[str, Any], given: dict[str, Any], what: str) -> None:
    """A name the ABI does not have is an error, never a zero sent in its place (a renamed argument
    would otherwise make a call revert for another reason than the one a test means to show)."""
    unknown = set(given) - {i["name"] for i in item["inputs"]}
    if unknown:
        raise TypeError(f"{what} has no argument {', '.join(sorted(unknown))}")


def _zero(item: dict[str, Any]) -> Any:
    kind = item["type"]
    if kind.endswith("]"):
        return []
    if kind == "tuple":
        return tuple(_zero(c) for c in item["components"])
    if kind.startswith(("uint", "int")):
        return 0
    if kind == "address":
        return "0x" + "00" * 20
    if kind == "bool":
        return False
    if kind == "string":
        return ""
    if kind == "bytes":
        return b""
    return b"\x00" * int(kind.removeprefix("bytes"))


def emitter_code(topics: int) -> bytes:
    """EVM runtime code that emits LOG<topics> of its calldata: ``topics`` 32-byte words, then
    the data. Put at a contract's address (anvil_setCode), it is that contract emitting any
    event with any arguments: an older or buggy version that accepted what today's refuses."""
    code = b""
    for i in reversed(range(topics)):  # topic 0 ends on top, under size and offset
        code += bytes([0x60, 32 * i, 0x35])  # PUSH1 32i CALLDATALOAD
    code += bytes([0x60, 32 * topics, 0x36, 0x03])  # len = CALLDATASIZE - 32 * topics
    code += bytes([0x80, 0x60, 32 * topics, 0x60, 0x00, 0x37])  # CALLDATACOPY(0, 32 * topics, len)
    code += bytes([0x60, 0x00, 0xA0 + topics, 0x00])  # LOG<topics>(0, len, topics...); STOP
    return code


def emit_as(w3: Web3, account: LocalAccount, log: dict[str, Any]) -> dict:
    """Have the contract at ``log["address"]`` emit ``log`` (from craft_log) in a real block on
    anvil: its code is swapped for ``emitter_code`` for one transaction, then restored (its
    storage is untouched). The receipt of that transaction."""
    address = log["address"]
    original = w3.eth.get_code(address)
    topics = list(log["topics"])
    w3.provider.make_request("anvil_setCode", [address, "0x" + emitter_code(len(topics)).hex()])
    try:
        receipt = send_raw(w3, account, address, b"".join(topics) + log["data"], gas=3_000_000)
    finally:
        w3.provider.make_request("anvil_setCode", [address, "0x" + bytes(original).hex()])
    assert receipt["status"] == 1 and len(receipt["logs"]) == 1, receipt
    return receipt


# ----------------------------------------------------------------------------- anvil's clock and state


def snapshot(w3: Web3) -> str:
    """anvil's evm_snapshot: the chain's whole state (blocks, balances, its clock) kept under an id."""
    return str(w3.provider.make_request("evm_snapshot", [])["result"])


def revert(w3: Web3, snapshot_id: str) -> None:
    """Back to ``snapshot_id`` (which is used up): every block after it is gone, its clock too."""
    assert w3.provider.make_request("evm_revert", [snapshot_id])["result"] is True, snapshot_id


def mine(w3: Web3, blocks: int, interval_s: int = 12) -> None:
    """``blocks`` empty blocks, ``interval_s`` apart: another block number, timestamp and
    prevrandao for whatever is sent next."""
    if blocks:
        w3.provider.make_request("anvil_mine", [hex(blocks), hex(interval_s)])


def increase_time(w3: Web3, seconds: int) -> None:
    """The chain's clock ``seconds`` ahead, and a block mined at that time."""
    w3.provider.make_request("evm_increaseTime", [int(seconds)])
    w3.provider.make_request("evm_mine", [])
