"""What ``GET /api/node`` and ``manage.py node status`` show: identity, chain, storage, workers, peers.

Each part asks the component that owns it (the ledger for chain state and peers,
the swarm store for storage) and degrades to ``available: false`` with an
``error`` sentence when that component is missing or unreachable, so the
dashboard can always render the page.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from urllib.parse import urlsplit

import requests
from django.conf import settings

from backend.api.exception_handler import scrub
from backend.identity.key import NodeKeyError, node_account
from backend.ledger import access as ledger_access
from backend.ledger.access import LEDGER_MISSING
from backend.ledger.models import ChainEvent
from backend.swarm.placement import overlay_address

logger = logging.getLogger(__name__)


def _describe(exc: Exception) -> str:
    # Any role reads these: no keystore path, RPC or peer URL (the log has the full error).
    return scrub(str(exc)) or type(exc).__name__


def identity() -> dict:
    try:
        address = node_account().address
    except NodeKeyError as exc:
        return {"address": None, "overlay": None, "identity_error": _describe(exc)}
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
        from backend.swarm.factory import storage_usage
    except ImportError:
        return unavailable | {"error": "the swarm store is not available on this node"}
    try:
        usage = storage_usage()
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
    """The other members of the NodeRegistry: do they answer, and when did we last hear from them.

    ``healthy`` is whether the peer answered its health check now (or, when it has no endpoint
    to ask, whether the swarm store has not marked it down); ``last_seen`` is the newer of the
    last answer this process got and the peer's last transaction the indexer mirrored.
    """
    ledger = ledger_access.node_ledger()
    if ledger is None:
        return [_static_peer(url) for url in settings.DEFL_PEERS]
    me = identity()["address"]
    up = _swarm_liveness()
    found = []
    for address in ledger.nodes.members():
        if address == me:
            continue
        node = ledger.nodes.get_node(address)
        found.append((address, node))
    answers = _probe_all({address: node.endpoint for address, node in found})
    active = _last_chain_activity(ledger, [address for address, _ in found])
    result = []
    for address, node in found:
        answered = answers.get(address)
        heard = max(filter(None, [_PROBES.last_ok(address), active.get(address.lower())]), default=None)
        result.append(
            {
                "address": address,
                "name": node.name,
                "endpoint": node.endpoint,
                "overlay": "0x" + bytes(node.overlay).hex(),
                "healthy": answered if answered is not None else up.get(address.lower()),
                "last_seen": heard,
            }
        )
    return result


class _ProbeCache:
    """Per-process answers of the peers' health checks, so polling dashboards ask each peer
    at most once per ``fresh_s``: (address -> (checked at, answered)), last success time."""

    fresh_s = 10.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checked: dict[str, tuple[float, bool]] = {}
        self._ok: dict[str, datetime] = {}

    def cached(self, address: str) -> bool | None:
        with self._lock:
            entry = self._checked.get(address)
        return entry[1] if entry and time.monotonic() - entry[0] < self.fresh_s else None

    def record(self, address: str, answered: bool) -> None:
        with self._lock:
            self._checked[address] = (time.monotonic(), answered)
            if answered:
                self._ok[address] = datetime.now(UTC)

    def last_ok(self, address: str) -> datetime | None:
        with self._lock:
            return self._ok.get(address)


_PROBES = _ProbeCache()
# A hostile member chooses its endpoint: ask only a fixed path, read no body, give up quickly.
PROBE_TIMEOUT_S = 1.5


def _probe(endpoint: str) -> bool | None:
    parts = urlsplit(endpoint or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        with requests.get(
            f"{endpoint.rstrip('/')}/api/health", timeout=PROBE_TIMEOUT_S, stream=True, allow_redirects=False
        ) as response:
            return response.status_code == 200
    except requests.RequestException:
        return False


def _probe_all(endpoints: dict[str, str]) -> dict[str, bool | None]:
    answers = {address: _PROBES.cached(address) for address in endpoints}
    due = [address for address, answer in answers.items() if answer is None]
    if due:
        with ThreadPoolExecutor(max_workers=min(8, len(due))) as pool:
            for address, answer in zip(due, pool.map(lambda a: _probe(endpoints[a]), due), strict=True):
                answers[address] = answer
                if answer is not None:
                    _PROBES.record(address, answer)
    return answers


# Arguments of the chain's events that name the node that sent the transaction.
_ACTOR_ARGS = ("node", "trainer", "member", "proposer", "owner", "spender", "voter")
ACTIVITY_WINDOW = 2000  # newest events searched for a peer's last transaction


def _last_chain_activity(ledger, addresses: list[str]) -> dict[str, datetime]:
    wanted = {address.lower() for address in addresses}
    newest: dict[str, int] = {}
    rows = ChainEvent.objects.order_by("-block_number", "-log_index").values_list("block_number", "args")
    for block, args in rows[:ACTIVITY_WINDOW]:
        for key in _ACTOR_ARGS:
            value = str((args or {}).get(key, "")).lower()
            if value in wanted and value not in newest:
                newest[value] = block
        if len(newest) == len(wanted):
            break
    times = block_times(ledger, set(newest.values()))
    return {address: times[block] for address, block in newest.items() if times.get(block)}


class _BlockTimes:
    """Block number -> timestamp, cached: a mined block's time never changes."""

    size = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: OrderedDict[tuple[int, int], datetime] = OrderedDict()

    def get(self, ledger, blocks: set[int]) -> dict[int, datetime]:
        try:
            chain = ledger.client.chain_id
        except Exception as exc:  # times are a nicety: without them the API shows null
            logger.info("block times unavailable: %r", exc)
            return {}
        out = {}
        for block in sorted(blocks):
            key = (chain, block)
            with self._lock:
                known = self._times.get(key)
            if known is None:
                try:
                    stamp = ledger.client.block_timestamp(block)
                except Exception as exc:
                    logger.info("block %s timestamp unavailable: %r", block, exc)
                    continue
                known = datetime.fromtimestamp(int(stamp), UTC)
                with self._lock:
                    self._times[key] = known
                    while len(self._times) > self.size:
                        self._times.popitem(last=False)
            out[block] = known
        return out


_BLOCK_TIMES = _BlockTimes()


def block_times(ledger, blocks: set[int]) -> dict[int, datetime]:
    if ledger is None or not blocks:
        return {}
    return _BLOCK_TIMES.get(ledger, blocks)


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
    """The newest events the ledger's indexer mirrored, with their blocks' times."""
    events = list(ChainEvent.objects.order_by("-block_number", "-log_index")[:limit])
    try:
        ledger = ledger_access.node_ledger()
    except Exception as exc:  # the list is still useful without times
        logger.info("ledger unavailable for event times: %r", exc)
        ledger = None
    times = block_times(ledger, {event.block_number for event in events})
    return [
        {
            "name": event.name,
            "contract": event.contract,
            "block": event.block_number,
            "tx_hash": event.tx_hash,
            "args": event.args,
            "timestamp": times.get(event.block_number),
        }
        for event in events
    ]
