"""`defl`: the command-line client of a DeFL node (a thin client of its REST API, docs/API.md).

    defl login --url http://127.0.0.1:8000 --username alice      # password asked, or --password-stdin
    defl datasets upload data.npz --name clinic-a --epsilon-cap 8 --delta 1e-5
    defl jobs create job.json && defl jobs watch 3
    defl models predict 5 --inputs rows.json --json

Every command prints a table (or, with --json, the API's JSON for scripts); a failure prints one
sentence on stderr and exits with a code that says which kind it was (docs/OPERATIONS.md, "The
command-line client"): 1 the node refused, 2 usage, 3 not logged in, 4 node unreachable,
5 the watched job failed or was cancelled, 6 a watch timed out.
"""

from __future__ import annotations

import argparse
import getpass
import io
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table
from urllib3 import encode_multipart_formdata

from defl_cli.client import (
    EXIT_JOB_ENDED_BADLY,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    Api,
    CliError,
    Credentials,
    ProgressBody,
    config_path,
    load_credentials,
)

TERMINAL = {"finished", "failed", "cancelled"}
MAX_INPUT_BYTES = 64 << 20  # a predict request's inputs file
MAX_CONFIG_BYTES = 1 << 20  # a job's JSON


class Cli:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)  # an error stays one line
        self._api: Api | None = None

    @property
    def api(self) -> Api:
        if self._api is None:
            credentials = load_credentials(self.args.url, self.args.token)
            self._api = Api(credentials.url, credentials.token)
        return self._api

    def emit(self, data: Any, table: Table | str | None = None) -> None:
        if self.args.json or table is None:
            print(json.dumps(data, indent=None if self.args.json else 2, default=str))
        else:
            self.out.print(table)

    def progress(self, *, transfer: bool) -> Progress:
        columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
        columns += (
            [DownloadColumn(), TransferSpeedColumn()]
            if transfer
            else [TextColumn("{task.completed:.0f}/{task.total:.0f}")]
        )
        # Progress goes to stderr and only to a terminal: --json output and pipes stay clean.
        return Progress(
            *columns, console=self.err, transient=True, disable=self.args.json or not self.err.is_terminal
        )


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    return table


def _read_json_file(path: str, limit: int, what: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise CliError(f"{what} {path} is not a file", EXIT_USAGE)
    if file.stat().st_size > limit:
        raise CliError(f"{what} {path} is larger than {limit} bytes", EXIT_USAGE)
    try:
        return json.loads(file.read_text())
    except ValueError as exc:
        raise CliError(f"{what} {path} is not valid JSON ({exc.args[0]})", EXIT_USAGE) from None


# ------------------------------------------------------------------ login, node


def cmd_login(cli: Cli) -> int:
    args = cli.args
    url = (args.url or "").rstrip("/")
    if not url:
        raise CliError(
            "give the node's address: defl login --url http://HOST:PORT --username NAME", EXIT_USAGE
        )
    password = (
        sys.stdin.readline().rstrip("\n")
        if args.password_stdin
        else getpass.getpass(f"password for {args.username}: ")
    )
    api = Api(url)
    device = f"defl-cli@{socket.gethostname()}"[:100]
    answer = api.post(
        "/api/auth/login", json={"username": args.username, "password": password, "device": device}
    )
    credentials = Credentials(
        url=url, token=answer["token"], username=args.username, token_id=answer.get("token_id")
    )
    if args.script:
        # A named token for scripts, listed and revoked on its own (/api/tokens); the login's own
        # token is then given back, so only the script token remains on this machine.
        logged_in = Api(url, answer["token"])
        made = logged_in.post("/api/tokens", json={"name": args.script, "days": args.days})
        credentials = Credentials(
            url=url, token=made["token"], username=args.username, token_id=made.get("id"), kind="script"
        )
        logged_in.post("/api/auth/logout", json={})
    credentials.save(config_path())
    result = {"url": url, "username": args.username, "kind": credentials.kind, "saved_to": str(config_path())}
    cli.emit(
        result, f"logged in to {url} as {args.username} ({credentials.kind} token saved in {config_path()})"
    )
    return EXIT_OK


def cmd_logout(cli: Cli) -> int:
    path = config_path()
    try:
        cli.api.post("/api/auth/logout", json={})
    finally:
        path.unlink(missing_ok=True)
    cli.emit({"logged_out": True}, "logged out; the saved token is deleted")
    return EXIT_OK


def cmd_node_status(cli: Cli) -> int:
    node = cli.api.get("/api/node")
    ready = _readiness(cli.api)
    data = {"node": node, "readiness": ready}
    chain, storage = node.get("chain") or {}, node.get("storage") or {}
    rows = [
        ["address", node.get("address")],
        ["name", node.get("name")],
        ["endpoint", node.get("endpoint")],
        [
            "chain",
            f"id {chain.get('chain_id')}, block {chain.get('block')}, indexed {chain.get('indexed_block')}, lag {chain.get('lag')}",
        ],
        ["storage", f"{storage.get('chunks')} chunks, {storage.get('bytes')} bytes"],
        ["device", node.get("device")],
        [
            "ready",
            "yes" if ready.get("status") == "ready" else "no: " + ", ".join(ready.get("not_ready") or []),
        ],
    ]
    for name, check in (ready.get("checks") or {}).items():
        rows.append([f"  {name}", ("ok: " if check.get("ok") else "NOT READY: ") + str(check.get("detail"))])
    cli.emit(data, _table("node", ["", ""], rows))
    return EXIT_OK


def _readiness(api: Api) -> dict:
    """Readiness answers 503 with its reasons when not ready: that is a state to show, not a failure."""
    response = api.session.get(api.url + "/api/health/ready", timeout=api.timeout_s)
    try:
        return response.json()
    except ValueError:
        return {"status": "unknown", "not_ready": ["readiness"], "checks": {}}


# ------------------------------------------------------------------ jobs


def _job_row(job: dict) -> list[Any]:
    return [
        job.get("id"),
        job.get("name"),
        job.get("status"),
        f"{job.get('current_round')}/{job.get('rounds')}",
        job.get("model"),
        len(job.get("participants") or []),
    ]


def cmd_jobs_ls(cli: Cli) -> int:
    jobs = cli.api.listing("/api/jobs")
    cli.emit(
        jobs,
        _table(
            "jobs", ["id", "name", "status", "round", "model", "participants"], [_job_row(j) for j in jobs]
        ),
    )
    return EXIT_OK


def cmd_jobs_show(cli: Cli) -> int:
    job = cli.api.get(f"/api/jobs/{cli.args.job}")
    rounds = cli.api.get(f"/api/jobs/{cli.args.job}/rounds")
    privacy = job.get("privacy") or {}
    rows = [
        [
            r["round"],
            r["phase"],
            sum(1 for u in r.get("updates") or [] if u.get("accepted")),
            len(r.get("updates") or []),
            (r.get("metrics") or {}).get("accuracy"),
        ]
        for r in rounds
    ]
    title = f"job {job['id']} {job.get('name')}: {job.get('status')}, round {job.get('current_round')}/{job.get('rounds')}, epsilon {privacy.get('epsilon_max')}"
    cli.emit(
        {"job": job, "rounds": rounds},
        _table(title, ["round", "phase", "accepted", "updates", "accuracy"], rows),
    )
    return EXIT_OK


def cmd_jobs_create(cli: Cli) -> int:
    payload = _read_json_file(cli.args.config, MAX_CONFIG_BYTES, "the job file")
    if not isinstance(payload, dict):
        raise CliError(
            f"the job file {cli.args.config} must hold a JSON object (the POST /api/jobs body)", EXIT_USAGE
        )
    if cli.args.name:
        payload["name"] = cli.args.name
    job = cli.api.post("/api/jobs", json=payload, timeout=300)
    cli.emit(
        job,
        f"job {job['id']} proposed on chain (tx {job.get('tx_hash')}); members join it with `defl jobs join {job['id']} --dataset ID`",
    )
    return EXIT_OK


def cmd_jobs_join(cli: Cli) -> int:
    job = cli.api.post(f"/api/jobs/{cli.args.job}/join", json={"dataset": cli.args.dataset}, timeout=300)
    cli.emit(job, f"joined job {cli.args.job} with dataset {cli.args.dataset}")
    return EXIT_OK


def cmd_jobs_start(cli: Cli) -> int:
    job = cli.api.post(f"/api/jobs/{cli.args.job}/start", json={}, timeout=300)
    cli.emit(job, f"job {cli.args.job} started; its first committee: {', '.join(job.get('committee') or [])}")
    return EXIT_OK


def cmd_jobs_cancel(cli: Cli) -> int:
    job = cli.api.post(f"/api/jobs/{cli.args.job}/cancel", json={}, timeout=300)
    cli.emit(job, f"job {cli.args.job} cancelled (tx {job.get('cancel_tx_hash')})")
    return EXIT_OK


def cmd_jobs_watch(cli: Cli) -> int:
    """Follow a job round by round until it ends: a progress bar on a terminal, one line per change."""
    args = cli.args
    deadline = time.monotonic() + args.timeout if args.timeout else None
    seen: tuple | None = None
    with cli.progress(transfer=False) as bar:
        task = bar.add_task(f"job {args.job}", total=None)
        while True:
            job = cli.api.get(f"/api/jobs/{args.job}")
            done = job["current_round"] - (0 if job["status"] in TERMINAL else 1)
            bar.update(
                task,
                total=job["rounds"],
                completed=max(done, 0),
                description=f"job {args.job} {job['status']}",
            )
            state = (job["status"], job["current_round"])
            if state != seen:
                seen = state
                line = {
                    "job": job["id"],
                    "status": job["status"],
                    "round": job["current_round"],
                    "rounds": job["rounds"],
                }
                if args.json:
                    print(json.dumps(line), flush=True)
                else:
                    bar.console.print(
                        f"job {job['id']}: {job['status']}, round {job['current_round']}/{job['rounds']}"
                    )
            if job["status"] in TERMINAL:
                return EXIT_OK if job["status"] == "finished" else EXIT_JOB_ENDED_BADLY
            if deadline is not None and time.monotonic() > deadline:
                raise CliError(
                    f"job {args.job} had not ended after {args.timeout:g} s (it is {job['status']})",
                    EXIT_TIMEOUT,
                )
            time.sleep(args.interval)


# ------------------------------------------------------------------ datasets


def cmd_datasets_ls(cli: Cli) -> int:
    rows = cli.api.listing("/api/datasets")
    table = _table("datasets", ["id", "name", "samples", "on chain", "epsilon spent", "epsilon left"], [
        [d["id"], d["name"], d.get("num_samples"), d.get("onchain_id"), (d.get("budget") or {}).get("epsilon_spent"), (d.get("budget") or {}).get("epsilon_left")]
        for d in rows
    ])  # fmt: skip
    cli.emit(rows, table)
    return EXIT_OK


def cmd_datasets_upload(cli: Cli) -> int:
    args = cli.args
    file = Path(args.file)
    if not file.is_file():
        raise CliError(f"{args.file} is not a file", EXIT_USAGE)
    fmt = args.format or file.suffix.lstrip(".").lower()
    if fmt not in ("csv", "npz"):
        raise CliError(
            f"cannot tell the format of {file.name}: give --format csv or --format npz", EXIT_USAGE
        )
    fields: dict[str, Any] = {
        "name": args.name or file.stem,
        "format": fmt,
        "epsilon_cap": str(args.epsilon_cap),
        "delta": str(args.delta),
        "public_holdout": "true" if args.public_holdout else "false",
        "file": (file.name, file.read_bytes(), "application/octet-stream"),
    }
    if args.label_column:
        fields["label_column"] = args.label_column
    if args.classes:
        fields["classes"] = args.classes
    body, content_type = encode_multipart_formdata(fields)
    with cli.progress(transfer=True) as bar:
        task = bar.add_task(f"uploading {file.name}", total=len(body))
        stream = ProgressBody(body, lambda sent: bar.update(task, completed=sent))
        dataset = cli.api.post(
            "/api/datasets", data=stream, headers={"Content-Type": content_type}, timeout=600
        )
    cli.emit(
        dataset,
        f"dataset {dataset['id']} {dataset['name']}: {dataset.get('num_samples')} records, encrypted and stored, on chain as {dataset.get('onchain_id')}",
    )
    return EXIT_OK


def cmd_datasets_grant(cli: Cli) -> int:
    grant = cli.api.post(
        f"/api/datasets/{cli.args.dataset}/grants", json={"node": cli.args.node}, timeout=300
    )
    cli.emit(grant, f"dataset {cli.args.dataset} granted to {cli.args.node}")
    return EXIT_OK


def cmd_datasets_revoke(cli: Cli) -> int:
    grant = cli.api.delete(f"/api/datasets/{cli.args.dataset}/grants/{cli.args.node}", timeout=300)
    cli.emit(grant, f"dataset {cli.args.dataset}: the grant to {cli.args.node} is revoked")
    return EXIT_OK


# ------------------------------------------------------------------ models


def cmd_models_ls(cli: Cli) -> int:
    rows = cli.api.listing("/api/models")
    table = _table(
        "models",
        ["id", "job", "round", "content hash", "created"],
        [[m["id"], m["job"], m["round"], m["content_hash"][:18], m.get("created")] for m in rows],
    )
    cli.emit(rows, table)
    return EXIT_OK


def _inputs(path: str) -> list:
    if path.endswith((".npy", ".npz")):
        import numpy as np

        file = Path(path)
        if not file.is_file() or file.stat().st_size > MAX_INPUT_BYTES:
            raise CliError(
                f"the inputs file {path} is missing or larger than {MAX_INPUT_BYTES} bytes", EXIT_USAGE
            )
        loaded = np.load(io.BytesIO(file.read_bytes()), allow_pickle=False)
        array = loaded["x"] if hasattr(loaded, "files") else loaded
        return array.tolist()
    data = _read_json_file(path, MAX_INPUT_BYTES, "the inputs file")
    rows = data.get("inputs") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise CliError(
            f'the inputs file {path} must hold a JSON list of rows (or {{"inputs": [...]}})', EXIT_USAGE
        )
    return rows


def cmd_models_predict(cli: Cli) -> int:
    answer = cli.api.post(
        f"/api/models/{cli.args.model}/predict", json={"inputs": _inputs(cli.args.inputs)}, timeout=300
    )
    predictions = answer.get("predictions") or []
    cli.emit(
        answer,
        _table(f"model {cli.args.model}", ["row", "prediction"], [[i, p] for i, p in enumerate(predictions)]),
    )
    return EXIT_OK


def cmd_models_download(cli: Cli) -> int:
    target = Path(cli.args.output or f"model-{cli.args.model}.safetensors")
    if target.exists() and not cli.args.force:
        raise CliError(f"{target} exists: give --force to replace it, or -o another path", EXIT_USAGE)
    with cli.progress(transfer=True) as bar:
        task = bar.add_task(f"model {cli.args.model}", total=None)
        size = cli.api.download(
            f"/api/models/{cli.args.model}/download",
            target,
            lambda done, total: bar.update(task, completed=done, total=total),
        )
    cli.emit(
        {"model": cli.args.model, "path": str(target), "bytes": size},
        f"model {cli.args.model} saved to {target} ({size} bytes)",
    )
    return EXIT_OK


# ------------------------------------------------------------------ the command line


def parser() -> argparse.ArgumentParser:
    def options(suppress: bool) -> argparse.ArgumentParser:
        # Accepted before and after the subcommand; a subcommand's parser must not reset what was
        # given before it (its defaults are suppressed).
        default: Any = argparse.SUPPRESS if suppress else None
        parent = argparse.ArgumentParser(add_help=False)
        parent.add_argument(
            "--url", default=default, help="the node's address (default: DEFL_URL, else the saved login)"
        )
        parent.add_argument(
            "--token", default=default, help="an API token (default: DEFL_TOKEN, else the saved login)"
        )
        parent.add_argument(
            "--json",
            action="store_true",
            default=argparse.SUPPRESS if suppress else False,
            help="print the API's JSON (for scripts)",
        )
        return parent

    common = options(suppress=True)
    root = argparse.ArgumentParser(
        prog="defl", description="The command-line client of a DeFL node.", parents=[options(suppress=False)]
    )
    groups = root.add_subparsers(
        dest="group", required=True, metavar="{login,logout,node,jobs,datasets,models}"
    )

    login = groups.add_parser("login", parents=[common], help="log in and save a token for the next commands")
    login.add_argument("--username", required=True)
    login.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    login.add_argument(
        "--script",
        metavar="NAME",
        help="save a named script token instead of a login (listed and revoked on its own)",
    )
    login.add_argument("--days", type=int, default=90, help="a script token's lifetime in days (default 90)")
    login.set_defaults(run=cmd_login)
    groups.add_parser("logout", parents=[common], help="end this login and forget its token").set_defaults(
        run=cmd_logout
    )

    node = groups.add_parser("node", parents=[common], help="this node").add_subparsers(
        dest="action", required=True
    )
    node.add_parser("status", parents=[common], help="identity, chain, storage and readiness").set_defaults(
        run=cmd_node_status
    )

    jobs = groups.add_parser("jobs", parents=[common], help="federated jobs").add_subparsers(
        dest="action", required=True
    )
    jobs.add_parser("ls", parents=[common], help="list jobs").set_defaults(run=cmd_jobs_ls)
    for name, run, text in (
        ("show", cmd_jobs_show, "a job and its rounds"),
        ("start", cmd_jobs_start, "start a job you proposed (its first committee is drawn on chain)"),
        ("cancel", cmd_jobs_cancel, "cancel a job you proposed"),
    ):
        sub = jobs.add_parser(name, parents=[common], help=text)
        sub.add_argument("job", type=int)
        sub.set_defaults(run=run)
    create = jobs.add_parser(
        "create", parents=[common], help="propose a job from a JSON file (the POST /api/jobs body)"
    )
    create.add_argument("config", help="the job's JSON file")
    create.add_argument("--name", help="override the file's name")
    create.set_defaults(run=cmd_jobs_create)
    join = jobs.add_parser("join", parents=[common], help="join a job with one of this node's datasets")
    join.add_argument("job", type=int)
    join.add_argument("--dataset", type=int, required=True)
    join.set_defaults(run=cmd_jobs_join)
    watch = jobs.add_parser("watch", parents=[common], help="follow a job until it ends (exit 0: finished)")
    watch.add_argument("job", type=int)
    watch.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    watch.add_argument("--timeout", type=float, default=0.0, help="give up after this many seconds (exit 6)")
    watch.set_defaults(run=cmd_jobs_watch)

    datasets = groups.add_parser("datasets", parents=[common], help="datasets and grants").add_subparsers(
        dest="action", required=True
    )
    datasets.add_parser("ls", parents=[common], help="list this node's datasets").set_defaults(
        run=cmd_datasets_ls
    )
    upload = datasets.add_parser(
        "upload", parents=[common], help="upload a dataset (encrypted before it leaves the node)"
    )
    upload.add_argument("file")
    upload.add_argument("--name")
    upload.add_argument("--format", choices=["csv", "npz"], help="default: the file's extension")
    upload.add_argument("--epsilon-cap", type=float, required=True, help="the dataset's privacy budget")
    upload.add_argument("--delta", type=float, required=True)
    upload.add_argument("--label-column", help="csv: the label's column")
    upload.add_argument(
        "--classes",
        required=True,
        help="class names in id order, comma-separated (declared: the published schema must not depend on the labels present)",
    )
    upload.add_argument("--public-holdout", action="store_true")
    upload.set_defaults(run=cmd_datasets_upload)
    for name, run, text in (
        ("grant", cmd_datasets_grant, "grant a node access"),
        ("revoke", cmd_datasets_revoke, "revoke a node's access"),
    ):
        sub = datasets.add_parser(name, parents=[common], help=text)
        sub.add_argument("dataset", type=int)
        sub.add_argument("node", help="the node's chain address (0x...)")
        sub.set_defaults(run=run)

    models = groups.add_parser("models", parents=[common], help="global models").add_subparsers(
        dest="action", required=True
    )
    models.add_parser("ls", parents=[common], help="list the models this node serves").set_defaults(
        run=cmd_models_ls
    )
    predict = models.add_parser("predict", parents=[common], help="predict with a model")
    predict.add_argument("model", type=int)
    predict.add_argument("--inputs", required=True, help="a JSON list of rows, or .npy / .npz (array x)")
    predict.set_defaults(run=cmd_models_predict)
    download = models.add_parser("download", parents=[common], help="download a model (safetensors)")
    download.add_argument("model", type=int)
    download.add_argument("-o", "--output", help="the file (default model-ID.safetensors)")
    download.add_argument("--force", action="store_true", help="replace an existing file")
    download.set_defaults(run=cmd_models_download)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cli = Cli(args)
    try:
        return args.run(cli)
    except CliError as exc:
        if args.json:
            print(json.dumps({"error": str(exc), "exit_code": exc.code}))
        cli.err.print(f"defl: {exc}", markup=False)
        return exc.code
    except KeyboardInterrupt:
        cli.err.print("defl: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
