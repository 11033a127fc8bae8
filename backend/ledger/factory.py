"""The one place that reads the ledger's settings and builds the client and contracts from them."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from django.conf import settings

from backend.identity.key import node_account

from .chains import connect, ensure_funds
from .client import ChainClient
from .deployment import Ledger, deploy_contracts, deployment_is_live, load_deployment, save_deployment
from .errors import LedgerConfigError
from .indexer import EventIndexer


def build_client() -> ChainClient:
    w3 = connect(settings.DEFL_CHAIN_URL)
    account = node_account()
    lock_dir = Path(settings.DEFL_LEDGER_LOCK_DIR)
    client = ChainClient(w3, account, nonce_lock_path=lock_dir / f"nonce-{account.address}.lock")
    if client.in_process or "anvil" in client.client_version().lower():
        client.read(lambda: ensure_funds(w3, account.address))  # development chains only
    return client


def deploy(client: ChainClient | None = None, *, allow_small_committees: bool | None = None) -> Ledger:
    """Deploy fresh contracts and record them in DEFL_CONTRACTS_FILE (`manage.py ledger deploy`).

    ``allow_small_committees``: a development deployment (`ledger deploy --allow-small-committees`);
    None: only for the in-process chain, which is a development chain by nature.
    """
    client = client or build_client()
    if allow_small_committees is None:
        allow_small_committees = client.in_process
    deployment = deploy_contracts(
        client,
        admission_threshold_pct=settings.DEFL_ADMISSION_THRESHOLD_PCT,
        allow_small_committees=allow_small_committees,
    )
    if not client.in_process:  # an in-process chain dies with the process: nothing to record
        save_deployment(deployment, settings.DEFL_CONTRACTS_FILE)
    return Ledger(client, deployment)


@lru_cache(maxsize=1)
def get_ledger() -> Ledger:
    """This node's Ledger. The in-process chain gets its contracts deployed on first use."""
    client = build_client()
    deployment = load_deployment(settings.DEFL_CONTRACTS_FILE)
    if deployment is not None and deployment_is_live(deployment, client):
        return Ledger(client, deployment)
    if client.in_process:
        return deploy(client)
    raise LedgerConfigError(
        f"no DeFL contracts on chain {client.chain_id} at the addresses in {settings.DEFL_CONTRACTS_FILE}: "
        "run `manage.py ledger deploy` (or point DEFL_CONTRACTS_FILE at the consortium's file)"
    )


def get_indexer(ledger: Ledger | None = None) -> EventIndexer:
    ledger = ledger or get_ledger()
    return EventIndexer(ledger.client, ledger.deployment, confirmations=settings.DEFL_CONFIRMATIONS)


def reset() -> None:
    """Forget the cached ledger (tests, or after the settings changed)."""
    get_ledger.cache_clear()
    node_account.cache_clear()
