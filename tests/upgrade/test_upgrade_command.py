"""The upgrade through `manage.py ledger` on an anvil chain: `deploy --upgrade-from`, `confirm-import`,
`status`, and a member's node refusing to confirm a deployment that does not import its own."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from web3 import HTTPProvider, Web3

from backend.ledger import factory
from backend.ledger.chains import without_chain_id_checks
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger, load_deployment, save_deployment
from devnet.anvil import AnvilProcess
from devnet.consortium import dev_account
from tests.upgrade.contract_upgrade import MEMBERS, deploy_previous, populate, previous_deployment

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_deploy_upgrade_from_confirm_import_and_status(tmp_path, capsys):
    with AnvilProcess() as anvil:
        w3 = without_chain_id_checks(Web3(HTTPProvider(anvil.url)))
        accounts = [dev_account(i, "upgrade-command") for i in range(MEMBERS)]
        for account in accounts:
            anvil.fund(account.address)
        old = deploy_previous(w3, accounts[0])
        populate(w3, old, accounts)
        old_file, new_file = tmp_path / "contracts.json", tmp_path / "contracts-v2.json"
        save_deployment(previous_deployment(w3, old), old_file)
        node_key = "0x" + accounts[0].key.hex().removeprefix("0x")  # this node is member 0
        settings = dict(
            DEFL_CHAIN_URL=anvil.url,
            DEFL_NODE_KEY=node_key,
            DEFL_CONTRACTS_FILE=str(old_file),
            DEFL_LEDGER_LOCK_DIR=str(tmp_path / "locks"),
        )
        with override_settings(**settings):
            factory.reset()
            try:
                call_command("ledger", "deploy", "--upgrade-from", str(old_file), "--out", str(new_file))
                out = capsys.readouterr().out
                status = json.loads(out[out.index('{\n  "import"') :])["import"]
                assert status == {
                    "open": True,
                    "members": MEMBERS,
                    "predecessor_members": MEMBERS,
                    "members_complete": True,
                    "datasets": MEMBERS,
                    "predecessor_datasets": MEMBERS,
                    "complete": True,
                }
                new = load_deployment(new_file)
                assert new is not None and new.previous is not None and new.previous.addresses == old
                # the node still runs on the old file: it checks the new one against it and confirms
                call_command("ledger", "confirm-import", str(new_file))
                assert "confirmed (1 of 2 confirmations)" in capsys.readouterr().out
                Ledger(ChainClient(w3, accounts[1]), new).nodes.confirm_import()  # member 1's node

                with pytest.raises(CommandError, match="the import is closed already"):
                    call_command("ledger", "confirm-import", str(new_file))
                # a deployment that imports from another consortium than this node's is refused
                foreign_file = tmp_path / "foreign.json"
                foreign = deploy_previous(w3, accounts[2])
                save_deployment(previous_deployment(w3, foreign), tmp_path / "foreign-old.json")
                call_command(
                    "ledger",
                    "deploy",
                    "--upgrade-from",
                    str(tmp_path / "foreign-old.json"),
                    "--out",
                    str(foreign_file),
                )
                with pytest.raises(CommandError, match="imports from .*, not this node's"):
                    call_command("ledger", "confirm-import", str(foreign_file))
            finally:
                factory.reset()
        capsys.readouterr()
        with override_settings(**dict(settings, DEFL_CONTRACTS_FILE=str(new_file))):
            factory.reset()
            try:
                call_command("ledger", "status")
                status = json.loads(capsys.readouterr().out)
                assert status["member"] is True and status["previous_contracts"] == old
                assert status["import"]["open"] is False and status["import"]["complete"] is True
            finally:
                factory.reset()
