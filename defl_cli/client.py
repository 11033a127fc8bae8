"""The node's REST API over HTTP, and the one way a request fails: ``CliError`` (a sentence, an exit code).

A thin client: it sends what the API documents (docs/API.md) and returns the decoded JSON. It
imports nothing of the node's code, so it runs where only the `defl` package is installed.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

# Exit codes, one per kind of failure a script may want to tell apart.
EXIT_OK = 0
EXIT_REFUSED = 1  # the node answered with an error (bad input, not found, conflict, its own failure)
EXIT_USAGE = 2  # the command line itself is wrong (argparse's own code)
EXIT_AUTH = 3  # not logged in, or the token expired or was revoked
EXIT_UNREACHABLE = 4  # no answer from the node (refused connection, timeout, not a DeFL node)
EXIT_JOB_ENDED_BADLY = 5  # `jobs watch`: the job failed or was cancelled
EXIT_TIMEOUT = 6  # `jobs watch --timeout`: the job had not ended in time
TIMEOUT_S = 60.0
CHUNK = 1 << 16
MAX_ERROR_CHARS = 300


class CliError(Exception):
    def __init__(self, sentence: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(sentence)
        self.code = code


def config_path() -> Path:
    explicit = os.environ.get("DEFL_CLI_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "defl" / "credentials.json"


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str
    username: str = ""
    token_id: int | None = None
    kind: str = "login"  # or "script": a named token, made by `defl login --script NAME`

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        # Written readable by its owner only, before a byte of the token is in it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w") as out:
            json.dump(self.__dict__, out)
        tmp.replace(path)


def load_credentials(url: str | None, token: str | None) -> Credentials:
    """--url/--token, else DEFL_URL/DEFL_TOKEN, else what `defl login` saved."""
    url = url or os.environ.get("DEFL_URL")
    token = token or os.environ.get("DEFL_TOKEN")
    saved: dict[str, Any] = {}
    path = config_path()
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read the saved login {path}: {exc}", EXIT_AUTH) from None
    url = url or saved.get("url")
    token = token or saved.get("token")
    if not url or not token:
        raise CliError(
            "not logged in: run `defl login --url URL --username NAME` (or set DEFL_URL and DEFL_TOKEN)",
            EXIT_AUTH,
        )
    return Credentials(url=url.rstrip("/"), token=token, username=saved.get("username", ""))


def _sentence(response: requests.Response) -> str:
    """The node's own sentence for a refusal: ``detail``, else the first field error."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        detail = body.get("detail")
        errors = body.get("errors")
        if isinstance(errors, dict) and errors:
            field, messages = next(iter(errors.items()))
            first = messages[0] if isinstance(messages, list) and messages else messages
            if not detail or str(detail).startswith("invalid"):
                return f"{field}: {first}"[:MAX_ERROR_CHARS]
        if detail:
            return str(detail)[:MAX_ERROR_CHARS]
    return f"the node answered HTTP {response.status_code}"


class Api:
    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "defl-cli"
        if token:
            self.session.headers["Authorization"] = f"Token {token}"
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, *, stream: bool = False, **kwargs: Any) -> requests.Response:
        try:
            response = self.session.request(
                method,
                self.url + path,
                timeout=kwargs.pop("timeout", self.timeout_s),
                stream=stream,
                **kwargs,
            )
        except requests.exceptions.Timeout:
            raise CliError(
                f"the node at {self.url} did not answer within {self.timeout_s:.0f} s", EXIT_UNREACHABLE
            ) from None
        except requests.exceptions.RequestException as exc:
            raise CliError(
                f"cannot reach the node at {self.url} ({type(exc).__name__})", EXIT_UNREACHABLE
            ) from None
        if response.status_code == 401:
            raise CliError(f"{_sentence(response)} (run `defl login` again)", EXIT_AUTH)
        if response.status_code >= 400:
            raise CliError(_sentence(response), EXIT_REFUSED)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise CliError(
                f"{self.url} answered {path} with something that is not JSON: is it a DeFL node?",
                EXIT_UNREACHABLE,
            ) from None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.json("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.json("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.json("DELETE", path, **kwargs)

    def listing(self, path: str, *, limit: int = 500) -> list[dict]:
        """Every row of a list endpoint, paginated (``results``/``next``) or not."""
        rows: list[dict] = []
        page: Any = self.get(path)
        while True:
            if not isinstance(page, dict):
                return list(page or [])[:limit]
            rows.extend(page.get("results") or [])
            following = page.get("next")
            if not following or len(rows) >= limit:
                return rows[:limit]
            page = (
                self.json("GET", following.removeprefix(self.url)) if following.startswith(self.url) else None
            )

    def download(self, path: str, target: Path, on_progress: Callable[[int, int | None], None]) -> int:
        """Stream ``path`` into ``target`` (written beside it, renamed when whole); the bytes written."""
        response = self.request("GET", path, stream=True)
        total = int(response.headers["Content-Length"]) if response.headers.get("Content-Length") else None
        partial = target.with_name(target.name + ".part")
        written = 0
        try:
            with open(partial, "wb") as out:
                for chunk in response.iter_content(CHUNK):
                    out.write(chunk)
                    written += len(chunk)
                    on_progress(written, total)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
        return written


class ProgressBody:
    """A request body read in chunks, reporting how much went out (requests sends its length)."""

    def __init__(self, data: bytes, on_progress: Callable[[int], None]) -> None:
        self.data = memoryview(data)
        self.offset = 0
        self.on_progress = on_progress

    def __len__(self) -> int:
        return len(self.data)

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size is None or size < 0 else min(self.offset + size, len(self.data))
        chunk = bytes(self.data[self.offset : end])
        self.offset = end
        self.on_progress(self.offset)
        return chunk

    def __iter__(self) -> Iterator[bytes]:
        while self.offset < len(self.data):
            yield self.read(CHUNK)
