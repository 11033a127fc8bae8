"""manage.py ledger deploy | index [--follow] | status"""

from __future__ import annotations

import json
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from backend.ledger import factory
from backend.ledger.errors import LedgerError
from backend.ledger.models import RejectedEvent


class Command(BaseCommand):
    help = "Deploy the DeFL contracts, index their events into the database, or show the ledger's status."
    requires_system_checks: list[str] = []  # the checks import every view (and torch): seconds

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        deploy = sub.add_parser("deploy", help="deploy the contracts and write DEFL_CONTRACTS_FILE")
        deploy.add_argument(
            "--allow-small-committees",
            action="store_true",
            help="development only: jobs may have committees of 1, 2 or an even size (one member "
            "of such a committee fixes models alone); a production deployment leaves it off",
        )
        index = sub.add_parser("index", help="mirror contract events into the database")
        index.add_argument("--follow", action="store_true", help="keep indexing new blocks")
        index.add_argument("--interval", type=float, default=None, help="seconds between passes (--follow)")
        index.add_argument("--confirmations", type=int, default=None, help="override DEFL_CONFIRMATIONS")
        sub.add_parser("status", help="chain, account, contracts and indexer position as JSON")

    def handle(self, *args, action: str, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except LedgerError as exc:
            raise CommandError(str(exc)) from exc

    def _deploy(self, allow_small_committees: bool = False, **options):
        ledger = factory.deploy(allow_small_committees=allow_small_committees or None)
        factory.get_ledger.cache_clear()
        self.stdout.write(json.dumps(ledger.deployment.addresses, indent=2))
        self.stdout.write(self.style.SUCCESS(f"deployed on chain {ledger.deployment.chain_id}"))

    def _index(
        self, follow: bool = False, interval: float | None = None, confirmations: int | None = None, **_
    ):
        indexer = factory.get_indexer()
        if confirmations is not None:
            indexer.confirmations = confirmations
        report = lambda r: self.stdout.write(  # noqa: E731
            f"blocks {r.from_block}..{r.to_block}: {r.events} events, {r.new_events} new, {r.rejected} rejected"
        )
        if not follow:
            report(indexer.sync())
            return
        stop = threading.Event()
        try:
            indexer.follow(interval=interval or settings.DEFL_INDEXER_INTERVAL, stop=stop, on_result=report)
        except KeyboardInterrupt:
            stop.set()

    def _status(self, **options):
        ledger = factory.get_ledger()
        indexer = factory.get_indexer(ledger)
        status = {
            "chain_id": ledger.client.chain_id,
            "block": ledger.client.block_number(),
            "account": ledger.client.address,
            "member": ledger.nodes.is_member(ledger.client.address),
            "contracts": ledger.deployment.addresses,
            "indexed_block": indexer.last_block(),
            "rejected_events": RejectedEvent.objects.count(),
        }
        self.stdout.write(json.dumps(status, indent=2))
