"""A restore from a backup taken before a contract upgrade keeps the node on the new contracts.

The backup holds the contracts file of its day; the node's current file names that deployment as
its ``previous`` (docs/OPERATIONS.md, Upgrades), so `node restore` leaves the current one in place.
Any other file (no upgrade since, another consortium) is replaced by the backup's, as before.
"""

from __future__ import annotations

from backend.ledger.deployment import save_deployment
from backend.ledger.resources import Deployment
from backend.nodes.backup import upgraded_since

OLD = Deployment(chain_id=7, block=1, addresses={"NodeRegistry": "0x" + "11" * 20})
NEW = Deployment(chain_id=7, block=90, addresses={"NodeRegistry": "0x" + "22" * 20}, previous=OLD)


def test_a_restore_keeps_the_contracts_the_consortium_moved_to_after_the_backup(settings, tmp_path):
    backed_up, current = tmp_path / "backup.json", tmp_path / "contracts.json"
    settings.DEFL_CONTRACTS_FILE = str(current)
    save_deployment(OLD, backed_up)
    assert not upgraded_since(backed_up)  # no contracts file here: the backup's is restored
    save_deployment(NEW, current)
    assert upgraded_since(backed_up)
    save_deployment(Deployment(chain_id=8, block=1, addresses=OLD.addresses), backed_up)
    assert not upgraded_since(backed_up)  # another chain's deployment
    save_deployment(OLD, current)
    save_deployment(OLD, backed_up)
    assert not upgraded_since(backed_up)  # the same deployment: restored as it was
    current.write_text("not json")
    assert not upgraded_since(backed_up)
