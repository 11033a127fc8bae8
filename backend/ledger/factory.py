"""The one place that reads the ledger's settings and builds the client and contracts from them."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from django.conf import settings

from backend.identity.key import node_account

from . import upgrade
from .chains import connect, default_confirmations, ensure_funds
from .client import ChainClient
from .deployment import Ledger, deploy_contracts, deployment_is_live, load_deployment, save_deployment
from .errors import LedgerConfigError
from .indexer import EventIndexer


def build_client() -> ChainClient:
    w3 = connect(settings.DEFL_CHAIN_URL)
    account = node_account()
    lock_dir = Path(settings.DEFL_LEDGER_LOCK_DIR)
    from backend.telemetry.counters import transaction_sent

    client = ChainClient(
        w3, account, nonce_lock_path=lock_dir / f"nonce-{account.address}.lock", observer=transaction_sent
    )
    if client.in_process or "anvil" in client.client_version().lower():
        client.read(lambda: ensure_funds(w3, account.address))  # development chains only
    return client


def deploy(
    client: ChainClient | None = None,
    *,
    allow_small_committees: bool | None = None,
    evm_version: str | None = None,
    upgrade_from: Path | None = None,
    out: Path | None = None,
) -> Ledger:
    """Deploy fresh contracts and record them in ``out`` (default DEFL_CONTRACTS_FILE; `manage.py
    ledger deploy`).

    ``allow_small_committees``: a development deployment (`ledger deploy --allow-small-committees`);
    None: only for the in-process chain, which is a development chain by nature.
    ``evm_version``: the chain's hardfork, whose compiled bytecode is deployed; None: DEFL_EVM_VERSION.
    ``upgrade_from``: the contracts file of the deployment the consortium upgrades from; the new
    contracts import its members and datasets (docs/OPERATIONS.md, Upgrades), and its admission
    threshold is kept.
    """
    client = client or build_client()
    predecessor = load_deployment(upgrade_from) if upgrade_from is not None else None
    if upgrade_from is not None and predecessor is None:
        raise LedgerConfigError(f"{upgrade_from} does not exist: name the contracts file to upgrade from")
    threshold = settings.DEFL_ADMISSION_THRESHOLD_PCT
    if predecessor is not None:  # the members check that both are the consortium's (upgrade.py)
        threshold = Ledger(client, predecessor).nodes.threshold_percent()
        if allow_small_committees is None:
            allow_small_committees = upgrade.allows_small_committees(client, predecessor)
    if allow_small_committees is None:
        allow_small_committees = client.in_process
    deployment = deploy_contracts(
        client,
        admission_threshold_pct=threshold,
        allow_small_committees=allow_small_committees,
        evm_version=evm_version or settings.DEFL_EVM_VERSION,
        predecessor=predecessor,
    )
    if out is not None:
        save_deployment(deployment, out)
    elif not client.in_process:  # an in-process chain dies with the process: nothing to record
        save_deployment(deployment, settings.DEFL_CONTRACTS_FILE)
    return Ledger(client, deployment)


def ledger_for(contracts_file: Path, client: ChainClient | None = None) -> Ledger:
    """A Ledger over another contracts file than this node's (an upgrade's new deployment)."""
    deployment = load_deployment(contracts_file)
    if deployment is None:
        raise LedgerConfigError(f"{contracts_file} does not exist")
    return Ledger(client or build_client(), deployment)


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


def confirmations(ledger: Ledger | None = None) -> int:
    """Blocks the indexer stays behind the head: DEFL_CONFIRMATIONS, else the chain kind's default."""
    if settings.DEFL_CONFIRMATIONS is not None:
        return settings.DEFL_CONFIRMATIONS
    return _chain_default_confirmations((ledger or get_ledger()).client)


@lru_cache(maxsize=8)
def _chain_default_confirmations(client: ChainClient) -> int:
    return client.read(lambda: default_confirmations(client.w3))  # one web3_clientVersion a client


def get_indexer(ledger: Ledger | None = None) -> EventIndexer:
    ledger = ledger or get_ledger()
    return EventIndexer(ledger.client, ledger.deployment, confirmations=confirmations(ledger))


def reset() -> None:
    """Forget the cached ledger (tests, or after the settings changed)."""
    get_ledger.cache_clear()
    node_account.cache_clear()
