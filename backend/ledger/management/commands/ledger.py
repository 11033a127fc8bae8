"""manage.py ledger deploy [--upgrade-from FILE --out FILE] | import FILE | confirm-import FILE | index [--follow] | status

An upgrade to a new contract version (docs/OPERATIONS.md, Upgrades): ``deploy --upgrade-from``
deploys contracts that import the old deployment's members and datasets and runs the import;
``import`` brings it up to date (anyone may); ``confirm-import`` is a member's confirmation, sent
only after its node checked the new deployment against the one it runs on (backend/ledger/upgrade.py).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from backend.ledger import factory, upgrade
from backend.ledger.artifacts import EVM_VERSIONS
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
        deploy.add_argument(
            "--evm-version",
            choices=EVM_VERSIONS,
            default=None,
            help="the chain's hardfork, whose compiled bytecode is deployed (default: DEFL_EVM_VERSION)",
        )
        deploy.add_argument(
            "--upgrade-from",
            type=Path,
            default=None,
            metavar="FILE",
            help="the contracts file of the deployment to upgrade from: the new contracts import its "
            "members and datasets, and take no other write until the members confirm",
        )
        deploy.add_argument(
            "--out",
            type=Path,
            default=None,
            metavar="FILE",
            help="where to write the new contracts file (default: DEFL_CONTRACTS_FILE)",
        )
        carry = sub.add_parser(
            "import",
            help="import (or bring up to date) the predecessor's members and datasets into FILE's contracts",
        )
        carry.add_argument("contracts", type=Path, metavar="FILE", help="the new deployment's contracts file")
        confirm = sub.add_parser(
            "confirm-import",
            help="check FILE's deployment against the one this node runs on and confirm its import (members)",
        )
        confirm.add_argument(
            "contracts", type=Path, metavar="FILE", help="the new deployment's contracts file"
        )
        index = sub.add_parser("index", help="mirror contract events into the database")
        index.add_argument("--follow", action="store_true", help="keep indexing new blocks")
        index.add_argument("--interval", type=float, default=None, help="seconds between passes (--follow)")
        index.add_argument("--confirmations", type=int, default=None, help="override DEFL_CONFIRMATIONS")
        sub.add_parser("status", help="chain, account, contracts and indexer position as JSON")

    def handle(self, *args, action: str, **options):
        try:
            getattr(self, f"_{action.replace('-', '_')}")(**options)
        except LedgerError as exc:
            raise CommandError(str(exc)) from exc

    def _deploy(
        self,
        allow_small_committees: bool = False,
        evm_version: str | None = None,
        upgrade_from: Path | None = None,
        out: Path | None = None,
        **options,
    ):
        ledger = factory.deploy(
            allow_small_committees=allow_small_committees or None,
            evm_version=evm_version,
            upgrade_from=upgrade_from,
            out=out,
        )
        factory.get_ledger.cache_clear()
        self.stdout.write(json.dumps(ledger.deployment.addresses, indent=2))
        self.stdout.write(
            self.style.SUCCESS(
                f"deployed on chain {ledger.deployment.chain_id} (EVM {ledger.deployment.evm_version})"
            )
        )
        if upgrade_from is not None:
            self._report_import(upgrade.carry_over(ledger))

    def _import(self, contracts: Path, **options):
        self._report_import(upgrade.carry_over(factory.ledger_for(contracts)))

    def _confirm_import(self, contracts: Path, **options):
        ledger = factory.ledger_for(contracts)
        runs_on = factory.get_ledger().deployment
        receipt = upgrade.confirm_import(ledger, runs_on)
        voted = receipt.event("ImportConfirmVoted").args
        closed = any(e.name == "ImportClosed" for e in receipt.events)
        self.stdout.write(
            self.style.SUCCESS(
                f"confirmed ({voted['votes']} of {voted['needed']} confirmations): "
                + (
                    f"the import is closed; point DEFL_CONTRACTS_FILE at {contracts} and restart the node"
                    if closed
                    else "the import closes when enough members confirm"
                )
            )
        )

    def _report_import(self, status: upgrade.ImportStatus) -> None:
        self.stdout.write(json.dumps({"import": status.as_dict()}, indent=2))

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
            "evm_version": ledger.deployment.evm_version,
            "confirmations": indexer.confirmations,
            "indexed_block": indexer.last_block(),
            "rejected_events": RejectedEvent.objects.count(),
        }
        if ledger.deployment.previous is not None:
            status["previous_contracts"] = ledger.deployment.previous.addresses
            status["import"] = upgrade.import_status(ledger).as_dict()
        self.stdout.write(json.dumps(status, indent=2))
