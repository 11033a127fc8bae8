"""``manage.py node init|status|admit|adduser|run|backup|restore``: bootstrap and inspect this node, vote new
members in, add users, back it up and restore it (backend/nodes/backup.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from backend.identity.key import NodeKeyError, account_from_settings, create_keystore
from backend.identity.roles import Role
from backend.jobs.agent_command import add_run_parser, run_agent
from backend.nodes.accounts import api_token, create_or_update_user
from backend.nodes.registration import register_node_on_chain, vote_admission


def _secret_from_env(variable: str, what: str) -> str:
    value = os.environ.get(variable, "")
    if not value:
        raise CommandError(f"{what}: environment variable {variable} is not set or empty")
    return value


class Command(BaseCommand):
    help = "Bootstrap this node (init), show its state (status), or add a user with a role (adduser)."
    # The system checks load the URLconf, hence every view and torch (seconds); these are
    # operational commands run many times by scripts and the local federation.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        sub = parser.add_subparsers(
            dest="subcommand", required=True, metavar="{init,status,admit,adduser,run,backup,restore}"
        )

        init = sub.add_parser("init", help="create (or import) the node key and register the node on chain")
        init.add_argument(
            "--import-key-env",
            metavar="VAR",
            help="import the hex private key held in environment variable VAR",
        )

        sub.add_parser("status", help="identity, chain height and lag, peers, storage")

        admit = sub.add_parser("admit", help="vote to admit an applicant node into the consortium")
        admit.add_argument("address", help="the applicant's chain address (0x...)")

        adduser = sub.add_parser("adduser", help="create a user (or change its role)")
        adduser.add_argument("username")
        adduser.add_argument("--role", required=True, choices=[r.value for r in Role])
        adduser.add_argument(
            "--password-env",
            metavar="VAR",
            help="read the password from environment variable VAR (else: token only)",
        )

        add_run_parser(sub)

        backup = sub.add_parser("backup", help="a consistent backup of this node, while it runs")
        backup.add_argument("directory", help="a new (or empty) directory; it will hold secrets")
        backup.add_argument(
            "--with-chunks", action="store_true", help="copy the chunk files too (peers hold replicas)"
        )

        restore = sub.add_parser("restore", help="restore this node from a backup (stop its processes first)")
        restore.add_argument("directory")
        restore.add_argument(
            "--force", action="store_true", help="replace a database or keystore that holds data"
        )
        restore.add_argument(
            "--no-fetch", action="store_true", help="do not fetch the chunks missing here from peers now"
        )

    def handle(self, *args, subcommand: str, **options):
        if subcommand == "run":
            self._refuse_foreign_protocol()
            return run_agent(self, **options)
        handlers: dict[str, Callable[..., None]] = {
            "init": self.init,
            "status": self.status,
            "admit": self.admit,
            "adduser": self.adduser,
            "backup": self.backup,
            "restore": self.restore,
        }
        handlers[subcommand](**options)

    # ------------------------------------------------------------------ admit

    def admit(self, address: str, **_options):
        try:
            vote = vote_admission(address)
        except Exception as exc:  # the ledger's typed errors: one sentence, exit non-zero
            raise CommandError(f"admission vote failed: {exc}") from exc
        self.stdout.write(self.style.SUCCESS(vote.detail))

    # ------------------------------------------------------------------ init

    def init(self, import_key_env: str | None = None, **_options):
        account = self._key(import_key_env)
        self.stdout.write(f"node address: {account.address}")
        try:
            registration = register_node_on_chain(account)
        except Exception as exc:  # the ledger's errors: report in a sentence, exit non-zero
            raise CommandError(f"registration on chain failed: {exc}") from exc
        line = f"chain registration: {registration.status} ({registration.detail})"
        if registration.tx_hash:
            line += f", tx {registration.tx_hash}"
        self.stdout.write(
            self.style.WARNING(line) if registration.status == "skipped" else self.style.SUCCESS(line)
        )

    def _key(self, import_key_env: str | None):
        if settings.DEFL_NODE_KEY:
            if import_key_env:
                raise CommandError(
                    "DEFL_NODE_KEY is set: the key comes from the environment, nothing to import"
                )
            self.stdout.write("key: from DEFL_NODE_KEY (no keystore needed)")
            return self._load()
        path = settings.DEFL_KEYSTORE_PATH
        if os.path.exists(path):
            if import_key_env:
                raise CommandError(f"{path} exists already; refusing to replace the node key")
            self.stdout.write(f"key: existing keystore {path}")
            return self._load()
        private_key = _secret_from_env(import_key_env, "--import-key-env") if import_key_env else None
        try:
            account = create_keystore(path, settings.DEFL_KEYSTORE_PASSWORD, private_key)
        except NodeKeyError as exc:
            raise CommandError(str(exc)) from exc
        except ValueError as exc:  # eth-account's error for a malformed imported key
            raise CommandError(f"{import_key_env} does not hold a valid secp256k1 private key") from exc
        self.stdout.write(
            f"key: {'imported into' if private_key else 'created in'} encrypted keystore {path}"
        )
        return account

    def _load(self):
        try:
            return account_from_settings(
                settings.DEFL_NODE_KEY, settings.DEFL_KEYSTORE_PATH, settings.DEFL_KEYSTORE_PASSWORD
            )
        except NodeKeyError as exc:
            raise CommandError(str(exc)) from exc

    # ------------------------------------------------------------------ status

    def status(self, **_options):
        # Here, not at the top: the overview imports torch (seconds of CPU), which init, admit
        # and adduser do not need (a local federation runs ~20 of them per start).
        from backend.nodes import overview

        node = overview.node_overview()
        self.stdout.write(f"name:      {node['name']}  endpoint: {node['endpoint']}")
        self.stdout.write(f"address:   {node['address'] or '-  (' + str(node['identity_error']) + ')'}")
        self.stdout.write(f"overlay:   {node['overlay'] or '-'}")
        chain = node["chain"]
        if chain["available"]:
            self.stdout.write(
                f"chain:     id {chain['chain_id']}, block {chain['block']}, "
                f"indexed {chain['indexed_block']}, lag {chain['lag']}"
            )
        else:
            self.stdout.write(f"chain:     unavailable ({chain['error']})")
        storage = node["storage"]
        if storage["available"]:
            self.stdout.write(
                f"storage:   {storage['chunks']} chunks, {storage['bytes']} bytes, {storage['pinned_chunks']} pinned"
            )
        else:
            self.stdout.write(f"storage:   unavailable ({storage['error']})")
        workers = node["workers"]
        self.stdout.write(
            f"workers:   {'in-process' if workers['eager'] else 'broker ' + str(workers['broker'])}"
        )
        self.stdout.write(f"device:    {node['device']}")
        if chain["available"]:
            from backend.ledger import access
            from backend.ledger.versions import check_deployment, deployed_versions

            ledger = access.node_ledger()
            versions = ", ".join(f"{v.contract} {v.version}" for v in deployed_versions(ledger))
            problem = check_deployment(ledger)
            self.stdout.write(f"protocol:  {versions}" + (f"  NOT SPOKEN: {problem}" if problem else ""))
        try:
            peers = overview.peers()
        except Exception as exc:  # peers come from the chain: show why they are missing
            self.stdout.write(f"peers:     unavailable ({exc})")
            return
        self.stdout.write(f"peers:     {len(peers)}")
        for peer in peers:
            self.stdout.write(f"  {peer['address'] or '?':42}  {peer['name'] or '-':16}  {peer['endpoint']}")

    def _refuse_foreign_protocol(self) -> None:
        """Stop before the agent starts when the contracts speak a protocol this node does not."""
        from backend.ledger import access
        from backend.ledger.versions import check_deployment

        try:
            ledger = access.node_ledger()
            problem = check_deployment(ledger) if ledger is not None else None
        except Exception:  # no chain or no contracts: the agent's own start says which
            return
        if problem:
            raise CommandError(f"cannot start the agent: {problem}")

    # ------------------------------------------------------------------ backup, restore

    def backup(self, directory: str, with_chunks: bool = False, **_options):
        from backend.nodes.backup import BackupError, backup

        try:
            report = backup(Path(directory), with_chunks=with_chunks)
        except BackupError as exc:
            raise CommandError(f"backup failed: {exc}") from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"backed up into {report.directory}: {report.files} files, {report.bytes} bytes, "
                f"{report.chunks} chunks, in {report.seconds:.2f} s (it holds the node's secrets: keep it private)"
            )
        )

    def restore(self, directory: str, force: bool = False, no_fetch: bool = False, **_options):
        from backend.nodes.backup import BackupError, restore

        try:
            report = restore(Path(directory), force=force, fetch_chunks=not no_fetch)
        except BackupError as exc:
            raise CommandError(f"restore failed: {exc}") from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"restored from {directory} in {report.seconds:.2f} s"
                + (" (migrated to this release's schema)" if report.migrated else "")
                + f"; chunks missing here {report.chunks_missing}, fetched from peers {report.chunks_fetched}, "
                f"left to the peers' repairs {report.chunks_unavailable}"
            )
        )

    # ------------------------------------------------------------------ adduser

    def adduser(self, username: str, role: str, password_env: str | None = None, **_options):
        password = _secret_from_env(password_env, "--password-env") if password_env else None
        user, created = create_or_update_user(username, role, password)
        self.stdout.write(
            self.style.SUCCESS(f"{'created' if created else 'updated'} {username} with role {role}")
        )
        # The token is how scripts and the CLI authenticate; it is shown once, here.
        self.stdout.write(f"API token: {api_token(user)}")
