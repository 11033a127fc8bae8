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

from backend.nodes.identity import NodeKeyError, node_account

logger = logging.getLogger(__name__)


def _describe(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def identity() -> dict:
    try:
        address = node_account().address
    except NodeKeyError as exc:
        return {"address": None, "overlay": None, "identity_error": str(exc)}
    return {"address": address, "overlay": _overlay(address), "identity_error": None}


def _overlay(address: str) -> str | None:
    try:
        from backend.swarm.placement import overlay_address
    except ImportError:
        return None
    return "0x" + overlay_address(address).hex()


def chain_status() -> dict:
    unavailable = {"available": False, "chain_id": None, "block": None, "indexed_block": None, "lag": None}
    try:
        from backend.ledger.factory import get_client
    except ImportError:
        return unavailable | {"contracts": {}, "error": "the ledger is not available on this node"}
    try:
        status = get_client().status()
    except Exception as exc:  # the ledger's errors and its client's set-up errors alike: show, don't fail
        logger.warning("chain status unavailable: %r", exc)
        return unavailable | {"contracts": {}, "error": _describe(exc)}
    return {
        "available": True,
        "chain_id": status.chain_id,
        "block": status.block,
        "indexed_block": status.indexed_block,
        "lag": max(status.block - status.indexed_block, 0) if status.indexed_block is not None else None,
        "contracts": dict(status.contracts),
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
    """Other nodes registered on chain, with the swarm's view of their health."""
    try:
        from backend.ledger.factory import get_client
    except ImportError:
        return [_static_peer(url) for url in settings.DEFL_PEERS]
    return [
        {
            "address": node.address,
            "name": node.name,
            "endpoint": node.endpoint,
            "overlay": _overlay(node.address),
            "healthy": None,
            "last_seen": None,
        }
        for node in get_client().node_registry.members()
    ]


def _static_peer(url: str) -> dict:
    # Before the chain's registry is available, peers are only URLs from DEFL_PEERS.
    return {"address": "", "name": "", "endpoint": url, "overlay": None, "healthy": None, "last_seen": None}


def recent_events(limit: int) -> list[dict]:
    try:
        from backend.ledger.models import ChainEvent
    except ImportError:
        return []
    return [
        {
            "name": event.name,
            "contract": event.contract,
            "block": event.block,
            "tx_hash": event.tx_hash,
            "args": event.args,
            "timestamp": event.timestamp,
        }
        for event in ChainEvent.objects.order_by("-block", "-log_index")[:limit]
    ]
