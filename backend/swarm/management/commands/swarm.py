"""``manage.py swarm put|get|stat|pin|unpin|repair|gc``: the store from the command line, as this node."""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from backend.swarm import factory
from backend.swarm.errors import SwarmError


def _bar() -> Progress:
    return Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn()
    )


class Command(BaseCommand):
    help = "Store and fetch blobs on the swarm store, show usage, repair replication, collect garbage."
    # The system checks import the URLconf (and with it every app's views); a storage
    # command needs none of that.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True)
        put = sub.add_parser("put", help="upload a file; prints its reference")
        put.add_argument("file")
        put.add_argument(
            "--encrypt", action="store_true", help="encrypt (the reference then carries the key)"
        )
        put.add_argument("--pin", action="store_true", help="also keep a full copy on this node")
        get = sub.add_parser("get", help="download a blob to a file")
        get.add_argument("reference")
        get.add_argument("out")
        stat = sub.add_parser("stat", help="this node's store usage, or one blob's size and chunks")
        stat.add_argument("reference", nargs="?")
        pin = sub.add_parser("pin", help="keep a full copy of a blob on this node")
        pin.add_argument("reference")
        unpin = sub.add_parser("unpin", help="release a pin")
        unpin.add_argument("reference")
        repair = sub.add_parser(
            "repair", help="restore R copies of one blob's chunks, or of all chunks held here"
        )
        repair.add_argument("reference", nargs="?")
        repair.add_argument(
            "--exists-only",
            action="store_true",
            help="only check that copies exist (faster: responsible nodes do not re-hash their copies)",
        )
        gc = sub.add_parser("gc", help="drop unpinned chunks this node is not responsible for")
        gc.add_argument("--grace", type=float, default=3600.0, help="keep chunks younger than this (seconds)")

    def handle(self, *args, subcommand: str, **options):
        try:
            getattr(self, f"do_{subcommand}")(**options)
        except SwarmError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            factory.node_swarm().close()

    def do_put(self, file: str, encrypt: bool, pin: bool, **_):
        path = Path(file)
        if not path.is_file():
            raise CommandError(f"{file}: no such file")
        with _bar() as bar:
            task = bar.add_task("upload", total=path.stat().st_size)
            with path.open("rb") as stream:
                ref = factory.node_swarm().put(
                    stream, encrypt=encrypt, pin=pin, progress=lambda d: bar.update(task, completed=d)
                )
        self.stdout.write(str(ref))

    def do_get(self, reference: str, out: str, **_):
        swarm = factory.node_swarm()
        limit = settings.DEFL_SWARM_MAX_BLOB_BYTES
        size = swarm.stat(reference, max_bytes=limit).size
        tmp = f"{out}.part"
        with _bar() as bar:
            task = bar.add_task("download", total=size)
            swarm.get(reference, tmp, max_bytes=limit, progress=lambda d: bar.update(task, completed=d))
        os.replace(tmp, out)
        stats = swarm.last_fetch_stats
        if stats.corrupt or stats.missing:
            self.stderr.write(f"repaired on the way: {stats.corrupt} corrupt, {stats.missing} missing copies")

    def do_stat(self, reference: str | None, **_):
        swarm = factory.node_swarm()
        if reference:
            body = swarm.stat(reference, max_bytes=settings.DEFL_SWARM_MAX_BLOB_BYTES).__dict__
        else:
            stat = swarm.node_stat()
            body = {**stat.__dict__, "usage": stat.usage.__dict__}
        self.stdout.write(json.dumps(body, indent=2))

    def do_pin(self, reference: str, **_):
        with _bar() as bar:
            task = bar.add_task("pin (chunks)", total=None)
            count = factory.node_swarm().pin(reference, progress=lambda d: bar.update(task, completed=d))
        self.stdout.write(f"pinned {count} chunks")

    def do_unpin(self, reference: str, **_):
        factory.node_swarm().unpin(reference)
        self.stdout.write("unpinned")

    def do_repair(self, reference: str | None, exists_only: bool = False, **_):
        with _bar() as bar:
            task = bar.add_task("repair (chunks)", total=None)
            report = factory.node_swarm().repair(
                reference, verify=not exists_only, progress=lambda d: bar.update(task, completed=d)
            )
        self.stdout.write(json.dumps(report.__dict__))

    def do_gc(self, grace: float, **_):
        self.stdout.write(json.dumps(factory.node_swarm().gc(grace_s=grace).__dict__))
