"""What ``GET /api/node`` and ``manage.py node status`` show: identity, chain, storage, workers, peers.

Each part asks the component that owns it (the ledger for chain state and peers,
the swarm store for storage) and degrades to ``available: false`` with an
``error`` sentence when that component is missing or unreachable, so the
dashboard can always render the page.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from django.conf import settings

from backend.nodes import ledger_access
from backend.nodes.identity import NodeKeyError, node_account
from backend.nodes.ledger_access import LEDGER_MISSING
from backend.swarm.placement import overlay_address

logger = logging.getLogger(__name__)


def _describe(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def identity() -> dict:
    try:
        address = node_account().address
    except NodeKeyError as exc:
        return {"address": None, "overlay": None, "identity_error": str(exc)}
    return {"address": address, "overlay": _overlay(address), "identity_error": None}


def _overlay(address: str) -> str:
    return "0x" + overlay_address(address).hex()


def chain_status() -> dict:
    unavailable = {"available": False, "chain_id": None, "block": None, "indexed_block": None, "lag": None}
    try:
        ledger = ledger_access.node_ledger()
        if ledger is None:
            return unavailable | {"contracts": {}, "error": LEDGER_MISSING}
        block = ledger.client.block_number()
        chain_id = ledger.client.chain_id
    except Exception as exc:  # the ledger's errors and its set-up errors alike: show them, don't fail
        logger.warning("chain status unavailable: %r", exc)
        return unavailable | {"contracts": {}, "error": _describe(exc)}
    indexed = ledger_access.indexed_block(ledger)
    return {
        "available": True,
        "chain_id": chain_id,
        "block": block,
        "indexed_block": indexed,
        "lag": max(block - indexed, 0) if indexed is not None else None,
        "contracts": dict(ledger.deployment.addresses),
        "error": None,
    }


def storage_status() -> dict:
    unavailable = {"available": False, "chunks": None, "bytes": None, "pinned_chunks": None}
    try:
        from backend.swarm.factory import local_store
    except ImportError:
        return unavailable | {"error": "the swarm store is not available on this node"}
    try:
        usage = local_store().usage()
    except Exception as exc:  # a broken chunk directory must not take the status page down
        logger.warning("storage usage unavailable: %r", exc)
        return unavailable | {"error": _describe(exc)}
    return {
        "available": True,
        "chunks": usage.chunks,
        "bytes": usage.bytes,
        "pinned_chunks": usage.pinned_chunks,
        "error": None,
    }


def workers_status() -> dict:
    broker = settings.CELERY_BROKER_URL
    # Only the host: the broker URL may carry a password.
    return {
        "broker": urlsplit(broker).hostname if broker else None,
        "eager": settings.CELERY_TASK_ALWAYS_EAGER,
    }


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def node_overview() -> dict:
    return {
        **identity(),
        "name": settings.DEFL_NODE_NAME,
        "endpoint": settings.DEFL_NODE_ENDPOINT,
        "chain": chain_status(),
        "storage": storage_status(),
        "workers": workers_status(),
        "device": device(),
    }


def peers() -> list[dict]:
    """The other members of the NodeRegistry, with the swarm's view of whether they answer."""
    ledger = ledger_access.node_ledger()
    if ledger is None:
        return [_static_peer(url) for url in settings.DEFL_PEERS]
    me = identity()["address"]
    up = _swarm_liveness()
    result = []
    for address in ledger.nodes.members():
        if address == me:
            continue
        node = ledger.nodes.get_node(address)
        result.append(
            {
                "address": address,
                "name": node.name,
                "endpoint": node.endpoint,
                "overlay": "0x" + bytes(node.overlay).hex(),
                "healthy": up.get(address.lower()),
                "last_seen": None,
            }
        )
    return result


def _swarm_liveness() -> dict[str, bool]:
    """address (lower-case) -> whether the swarm currently counts the peer as up."""
    try:
        from backend.swarm.factory import node_swarm

        nodes = node_swarm().node_stat().nodes
    except Exception as exc:  # health is a hint: unknown (None) when the store cannot say
        logger.info("peer liveness unavailable: %r", exc)
        return {}
    return {str(n["address"]).lower(): bool(n["up"]) for n in nodes}


def _static_peer(url: str) -> dict:
    # Without the chain's registry, peers are only the DEFL_PEERS entries ("address@url" or a URL).
    address, _, endpoint = url.rpartition("@")
    return {
        "address": address,
        "name": "",
        "endpoint": endpoint,
        "overlay": None,
        "healthy": None,
        "last_seen": None,
    }


def recent_events(limit: int) -> list[dict]:
    """The newest events the ledger's indexer mirrored (block timestamps are not indexed: null)."""
    from backend.ledger.models import ChainEvent

    return [
        {
            "name": event.name,
            "contract": event.contract,
            "block": event.block_number,
            "tx_hash": event.tx_hash,
            "args": event.args,
            "timestamp": None,
        }
        for event in ChainEvent.objects.order_by("-block_number", "-log_index")[:limit]
    ]
