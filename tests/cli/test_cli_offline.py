"""The `defl` client's refusals that need no node: one sentence on stderr and the exit code."""

from __future__ import annotations

import json

import pytest

from defl_cli import client
from defl_cli.main import main


@pytest.fixture(autouse=True)
def no_saved_login(monkeypatch, tmp_path):
    monkeypatch.setenv("DEFL_CLI_CONFIG", str(tmp_path / "credentials.json"))
    monkeypatch.delenv("DEFL_URL", raising=False)
    monkeypatch.delenv("DEFL_TOKEN", raising=False)


def test_a_command_before_login_says_how_to_log_in(capsys):
    assert main(["jobs", "ls"]) == client.EXIT_AUTH
    err = capsys.readouterr().err
    assert err.startswith("defl: not logged in: run `defl login") and err.count("\n") == 1


def test_an_unreachable_node_is_exit_4_and_json_says_so(capsys):
    # Port 1 of loopback: nothing listens there.
    assert (
        main(["--json", "jobs", "ls", "--url", "http://127.0.0.1:1", "--token", "t"])
        == client.EXIT_UNREACHABLE
    )
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == 4 and out["error"].startswith("cannot reach the node at http://127.0.0.1:1")


def test_options_before_the_subcommand_are_kept(capsys):
    assert main(["--json", "--url", "http://127.0.0.1:1", "--token", "t", "node", "status"]) == 4
    assert json.loads(capsys.readouterr().out)["exit_code"] == 4


def test_a_job_file_that_is_not_json_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "job.json"
    bad.write_text("{not json")
    assert (
        main(["jobs", "create", str(bad), "--url", "http://127.0.0.1:1", "--token", "t"]) == client.EXIT_USAGE
    )
    assert "is not valid JSON" in capsys.readouterr().err


def test_a_download_never_replaces_a_file_without_force(tmp_path, capsys):
    existing = tmp_path / "model.safetensors"
    existing.write_bytes(b"keep")
    code = main(
        ["models", "download", "3", "-o", str(existing), "--url", "http://127.0.0.1:1", "--token", "t"]
    )
    assert code == client.EXIT_USAGE and existing.read_bytes() == b"keep"
    assert "give --force" in capsys.readouterr().err


def test_saved_credentials_are_readable_by_their_owner_only(tmp_path):
    path = tmp_path / "sub" / "credentials.json"
    client.Credentials(url="http://n", token="secret").save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["token"] == "secret"
