"""Connections to the three kinds of chain: in-process (eth-tester), anvil, any JSON-RPC URL."""

from __future__ import annotations

from functools import cache

from eth_utils import to_checksum_address
from web3 import HTTPProvider, Web3
from web3.middleware import ExtraDataToPOAMiddleware
from web3.providers.eth_tester import EthereumTesterProvider
from web3.types import RPCEndpoint, Wei

FUNDING_WEI = 1_000 * 10**18
# Confirmations (blocks behind the head) the indexer waits by default (DEFL_CONFIRMATIONS unset):
# none on a development chain that seals each transaction at once (the in-process EVM, anvil: a
# single sealer never forks); one on any other chain, e.g. a Clique consortium, where two
# validators sealing out of turn at once fork it for a block until the next in-turn block (which
# weighs twice as much) settles it. A deeper reorganisation is still followed: the mirror unwinds
# the dropped blocks (indexer.py); the confirmation spares the nodes acting on the common one.
INSTANT_CHAIN_CONFIRMATIONS = 0
VALIDATOR_CHAIN_CONFIRMATIONS = 1


def connect(url: str, *, timeout: float = 30.0) -> Web3:
    """An HTTP JSON-RPC connection; the process's in-process EVM when url is empty."""
    if not url:
        return in_process_chain()
    w3 = without_chain_id_checks(Web3(HTTPProvider(url, request_kwargs={"timeout": timeout})))
    # A Clique (PoA) block's extraData holds the sealer's 65-byte signature, longer than the 32
    # bytes web3 accepts in a block: moved to ``proofOfAuthorityData`` (a response formatter, no
    # request of its own; a chain with short extraData, anvil's, is read as before).
    w3.middleware_onion.inject(ExtraDataToPOAMiddleware, layer=0)
    return w3


@cache
def in_process_chain() -> Web3:
    """One in-process EVM (eth-tester + py-evm) per process: the embedded single-process chain."""
    return without_chain_id_checks(Web3(EthereumTesterProvider()))


def new_in_process_chain() -> Web3:
    """A fresh in-process EVM (tests)."""
    return without_chain_id_checks(Web3(EthereumTesterProvider()))


def without_chain_id_checks(w3: Web3) -> Web3:
    """``w3`` without web3's "validation" middleware, which costs two requests on every read.

    It asks the node for its chain id twice on each eth_call and eth_estimateGas (once for the
    request, once for the response) to check a ``chainId`` field that the node's calls never
    carry. It never checked what the node sends: transactions are signed here with the chain id
    read once (ChainClient.chain_id) and sent raw. Without it a contract read is one request,
    not three; on the round's critical path, where each request waits on a loaded chain, that
    was most of a read's time.
    """
    w3.middleware_onion.remove("validation")
    return w3


def is_development_chain(w3: Web3) -> bool:
    """The in-process EVM or anvil: one sealer that mines at once, with test RPCs."""
    return is_in_process(w3) or "anvil" in w3.client_version.lower()


def default_confirmations(w3: Web3) -> int:
    """DEFL_CONFIRMATIONS when it is not set, by the chain's kind (see the constants above)."""
    return INSTANT_CHAIN_CONFIRMATIONS if is_development_chain(w3) else VALIDATOR_CHAIN_CONFIRMATIONS


def is_in_process(w3: Web3) -> bool:
    return isinstance(w3.provider, EthereumTesterProvider)


def ensure_funds(w3: Web3, address: str, minimum: int = 10**18) -> None:
    """On development chains only: give an account gas money (tester transfer / anvil_setBalance)."""
    if w3.eth.get_balance(to_checksum_address(address)) >= minimum:
        return
    if is_in_process(w3):
        tx = w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": address, "value": Wei(FUNDING_WEI)})
        w3.eth.wait_for_transaction_receipt(tx)
    elif "anvil" in w3.client_version.lower():
        w3.provider.make_request(RPCEndpoint("anvil_setBalance"), [address, hex(FUNDING_WEI)])
