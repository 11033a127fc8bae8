"""Pure ABI work: encode calls, decode results and event logs. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_abi.codec import ABICodec
from eth_abi.decoding import StringDecoder
from eth_abi.registry import BaseEquals, registry
from eth_typing import ABIComponent, ABIElement, ABIEvent, ABIFunction
from eth_utils import (
    event_abi_to_log_topic,
    function_abi_to_4byte_selector,
    get_abi_input_types,
    get_abi_output_types,
    to_checksum_address,
)

from .artifacts import Artifact, all_artifacts


class ContractCall(NamedTuple):
    """A call ready to send: target, calldata and how to read the result."""

    to: str
    function: str
    data: bytes
    output_types: tuple[str, ...]


def functions_by_name(abi: list[ABIElement]) -> dict[str, ABIFunction]:
    return {item["name"]: item for item in abi if item["type"] == "function"}


def encode_call(to: str, fn_abi: ABIFunction, args: tuple[Any, ...]) -> ContractCall:
    data = function_abi_to_4byte_selector(fn_abi) + abi_encode(get_abi_input_types(fn_abi), list(args))
    return ContractCall(to, fn_abi["name"], data, tuple(get_abi_output_types(fn_abi)))


def encode_deploy(artifact: Artifact, args: tuple[Any, ...]) -> bytes:
    ctor = next((item for item in artifact.abi if item["type"] == "constructor"), None)
    encoded = abi_encode(get_abi_input_types(ctor), list(args)) if ctor else b""
    return artifact.bytecode + encoded


def decode_result(call: ContractCall, data: bytes) -> tuple[Any, ...]:
    return tuple(abi_decode(list(call.output_types), bytes(data)))


def to_json(value: Any, abi_type: ABIComponent) -> Any:
    """An ABI value as JSON: bytes as 0x-hex, tuples as dicts by component name."""
    kind = abi_type["type"]
    if kind.endswith("]"):
        inner: ABIComponent = {**abi_type, "type": kind[: kind.rindex("[")]}
        return [to_json(v, inner) for v in value]
    if kind == "tuple":
        return {c["name"]: to_json(v, c) for c, v in zip(abi_type["components"], value, strict=True)}
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if kind == "address":
        return to_checksum_address(value)
    return value


class _ReplacingStringDecoder(StringDecoder):
    @classmethod
    def from_type_str(cls, type_str, registry):
        return cls(handle_string_errors="replace")


# Event strings come from anyone who can send a transaction (a node's name, its endpoint): bytes
# that are not UTF-8 are replaced (U+FFFD), never an exception that would stop the indexer.
_events_registry = registry.copy()
_events_registry.unregister_decoder("string")
_events_registry.register_decoder(BaseEquals("string"), _ReplacingStringDecoder, label="string")
_event_codec = ABICodec(_events_registry)


@dataclass(frozen=True)
class DecodedEvent:
    contract: str
    name: str
    args: dict[str, Any]
    address: str
    block_number: int
    tx_hash: str
    log_index: int


class EventDecoder:
    """Decodes logs of the DeFL contracts by topic0, from the artifacts' ABIs."""

    def __init__(self, artifacts: tuple[Artifact, ...] | None = None):
        self._events: dict[bytes, tuple[str, ABIEvent]] = {}
        for artifact in artifacts or all_artifacts():
            for item in artifact.abi:
                if item["type"] == "event":
                    self._events[event_abi_to_log_topic(item)] = (artifact.name, item)

    def decode(self, log: Any) -> DecodedEvent | None:
        """A web3 log (AttributeDict or dict) as a DecodedEvent; None for foreign events."""
        topics = [bytes(t) for t in log["topics"]]
        found = self._events.get(topics[0]) if topics else None
        if found is None:
            return None
        contract, event_abi = found
        indexed = [i for i in event_abi["inputs"] if i["indexed"]]
        plain = [i for i in event_abi["inputs"] if not i["indexed"]]
        args: dict[str, Any] = {}
        for item, topic in zip(indexed, topics[1:], strict=True):
            (value,) = abi_decode([item["type"]], topic)
            args[item["name"]] = to_json(value, item)
        data = bytes(log["data"])
        values = _event_codec.decode(
            get_abi_input_types(ABIEvent(name=event_abi["name"], type="event", inputs=plain)), data
        )
        for item, value in zip(plain, values, strict=True):
            args[item["name"]] = to_json(value, item)
        ordered = {i["name"]: args[i["name"]] for i in event_abi["inputs"]}
        tx_hash = log["transactionHash"]
        return DecodedEvent(
            contract=contract,
            name=event_abi["name"],
            args=ordered,
            address=to_checksum_address(log["address"]),
            block_number=int(log["blockNumber"]),
            tx_hash=tx_hash if isinstance(tx_hash, str) else "0x" + bytes(tx_hash).hex(),
            log_index=int(log["logIndex"]),
        )
