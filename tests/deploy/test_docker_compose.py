"""docker-compose.yml stays correct without a Docker engine: structure, references and commands.

No engine runs on the test machines, so the file is checked the way `docker compose config`
would reject it, plus what only this project knows: every variable a node is given is one
the settings read, and every management command the services run exists.
"""

import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
BACKEND_SOURCE = "\n".join(p.read_text() for p in (ROOT / "backend").rglob("*.py"))


def _command(service: dict) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else list(command)


def test_top_level_keys_are_known():
    assert set(COMPOSE) <= {"name", "services", "volumes", "networks", "configs", "secrets"} | {
        k for k in COMPOSE if k.startswith("x-")
    }


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_is_well_formed(name):
    service = SERVICES[name]
    assert "image" in service or "build" in service, f"{name} has neither image nor build"
    image = service.get("image", "")
    assert image and ":" in image and not image.endswith(":latest"), f"{name}: pin the image tag"
    for dependency in service.get("depends_on", {}):
        assert dependency in SERVICES, f"{name} depends on unknown service {dependency}"
    for volume in service.get("volumes", []):
        source = volume.split(":")[0]
        if source.startswith("."):
            assert (ROOT / source).exists(), f"{name} mounts missing file {source}"
        else:
            assert source in COMPOSE.get("volumes", {}), f"{name} uses undeclared volume {source}"


def test_published_ports_are_unique():
    published = [p.split(":")[0] for s in SERVICES.values() for p in s.get("ports", [])]
    assert len(published) == len(set(published))


def test_node_environment_only_uses_settings_the_backend_reads():
    for name, service in NODE_SERVICES.items():
        for variable in service.get("environment", {}):
            assert f'"{variable}"' in BACKEND_SOURCE, f"{name} sets {variable}, which nothing reads"


def test_management_commands_exist():
    commands = get_commands()
    for name, service in SERVICES.items():
        argv = _command(service)
        if argv[:2] == ["python", "manage.py"]:
            assert argv[2] in commands, f"{name} runs unknown command manage.py {argv[2]}"


def test_secrets_come_from_the_environment():
    text = (ROOT / "docker-compose.yml").read_text()
    assert not re.search(r"(KEY|PASSWORD):\s*['\"]?[0-9a-fA-Fx]{16,}", text), "a literal secret"


def test_dockerfile_pins_the_cpu_torch_wheel():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in dockerfile


# ----------------------------------------------------------------------------- isolation (issue 13)

NETWORKS = COMPOSE.get("networks", {})
ORGS = ("a", "b", "c")
# The node's processes (web, worker, agent and the one-off deploy): the services given a node name.
NODE_SERVICES = {name: s for name, s in SERVICES.items() if "DEFL_NODE_NAME" in s.get("environment", {})}
VALIDATORS = {name: s for name, s in SERVICES.items() if name.startswith("validator-")}


def _networks(service: dict) -> list[str]:
    if service.get("network_mode") == "none":
        return []
    networks = service.get("networks", ["default"])
    return list(networks) if isinstance(networks, dict | list) else [networks]


def _org_of(name: str, service: dict) -> str:
    return service["environment"]["DEFL_NODE_NAME"].removeprefix("org-")


def test_the_chain_is_published_nowhere_and_sits_on_internal_networks_only():
    assert sorted(VALIDATORS) == [f"validator-{org}" for org in ORGS]
    for name, validator in VALIDATORS.items():
        assert not validator.get("ports") and not validator.get("expose"), (
            f"{name}'s RPC must not be published"
        )
        assert validator.get("network_mode") is None
        for network in _networks(validator):
            assert NETWORKS.get(network, {}).get("internal") is True, f"{name} is on non-internal {network}"
    published = [p for s in SERVICES.values() for p in s.get("ports", [])]
    assert not any(str(p).split(":")[-1].split("/")[0] in ("8545", "30303") for p in published)


def test_no_development_chain_or_rpc_is_in_the_deployment():
    """anvil (impersonation, storage writes, reset) is gone: the chain is the validators."""
    text = (ROOT / "docker-compose.yml").read_text()
    assert "anvil" not in text and "foundry" not in text
    for name, service in SERVICES.items():
        assert "--dev" not in _command(service), name


def test_each_node_talks_to_its_own_organizations_validator_only():
    for name, service in NODE_SERVICES.items():
        org = _org_of(name, service)
        url = urlsplit(service["environment"]["DEFL_CHAIN_URL"])
        assert url.hostname == f"validator-{org}" and url.port == 8545, name
        assert service["environment"]["DEFL_EVM_VERSION"] == "london", name  # the Clique chain's hardfork
        for other in ORGS:  # it cannot even reach another organization's validator
            if other != org:
                assert not set(_networks(service)) & set(_networks(SERVICES[f"validator-{other}"])) - {
                    "validators"
                }, (name, other)
        assert "validators" not in _networks(service), f"{name} must not join the validators' network"
    for org in ORGS:
        assert set(_networks(SERVICES[f"validator-{org}"])) == {f"org-{org}", "validators"}


def test_the_validators_boot_from_each_other_at_their_fixed_addresses(tmp_path):
    """The one-off `consortium` service writes the genesis (the three validators sign, the three
    nodes are funded) and each validator's bootnodes: the other two at their addresses."""
    from eth_account import Account

    from devnet.clique import enode_of

    keys = {
        f"ORG_{org.upper()}_{kind}_KEY": "0x" + secrets.token_hex(32)
        for org in ORGS
        for kind in ("VALIDATOR", "P2P", "NODE")
    }
    consortium = SERVICES["consortium"]
    assert set(keys) == set(consortium["environment"])
    script = _command(consortium)
    assert script[:2] == ["sh", "deploy/consortium-files.sh"]
    env = {**os.environ, **keys, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run(["sh", str(ROOT / script[1]), str(tmp_path)], cwd=ROOT, env=env, check=True, timeout=120)

    genesis = json.loads((tmp_path / "genesis.json").read_text())
    signers = bytes.fromhex(genesis["extraData"][2:])[32:-65]
    validators = {Account.from_key(keys[f"ORG_{o.upper()}_VALIDATOR_KEY"]).address.lower() for o in ORGS}
    assert {"0x" + signers[i : i + 20].hex() for i in range(0, len(signers), 20)} == validators
    assert {a.lower() for a in genesis["alloc"]} == {
        Account.from_key(keys[f"ORG_{o.upper()}_NODE_KEY"]).address.lower() for o in ORGS
    }
    addresses = {
        org: VALIDATORS[f"validator-{org}"]["networks"]["validators"]["ipv4_address"] for org in ORGS
    }
    for org in ORGS:
        command = _command(VALIDATORS[f"validator-{org}"])
        assert command[command.index("--extIP") + 1] == addresses[org]
        assert command[command.index("--bootnodes") + 1] == f"/consortium/bootnodes-{org}.txt"
        assert command[command.index("--unlock") + 1] == f"/consortium/validator-{org}.key"
        booted = (tmp_path / f"bootnodes-{org}.txt").read_text().split()
        p2p = {o: bytes.fromhex(keys[f"ORG_{o.upper()}_P2P_KEY"][2:]) for o in ORGS}
        assert booted == [enode_of(p2p[o], addresses[o], 30303) for o in ORGS if o != org]
        assert (tmp_path / f"validator-{org}.key").read_text().strip() == keys[
            f"ORG_{org.upper()}_VALIDATOR_KEY"
        ][2:]


def test_the_configured_peers_pass_the_private_address_rule():
    """The nodes dial each other at http://node-X:8000, a private address on the compose network:
    the operator's DEFL_PEERS are dialled (trusted endpoints); the same endpoint read from the chain
    without them is refused."""
    from django.test import override_settings

    from backend.peers.endpoints import EndpointGuard, EndpointRefused, check_url
    from backend.swarm.factory import allow_private_peers
    from backend.swarm.peers import StaticPeerDirectory, parse_peers
    from backend.swarm.registry import LedgerPeerDirectory

    addresses = {org: "0x" + secrets.token_hex(20) for org in ORGS}
    for name, service in NODE_SERVICES.items():
        configured = service["environment"]["DEFL_PEERS"]
        for org in ORGS:
            configured = configured.replace(
                f"${{ORG_{org.upper()}_NODE_ADDRESS:?set ORG_{org.upper()}_NODE_ADDRESS}}", addresses[org]
            )
        peers = parse_peers(configured.split(","))
        assert [(p.address.lower(), p.url) for p in peers] == [
            (addresses[o], f"http://node-{o}:8000") for o in ORGS
        ], name
        with override_settings(DEFL_ALLOW_PRIVATE_PEERS=False):
            configured_rule = allow_private_peers(StaticPeerDirectory(peers))
            chain_rule = allow_private_peers(LedgerPeerDirectory(lambda: [], ttl_s=5, allow_private=False))
        assert configured_rule is True and chain_rule is False
        for peer in peers:
            # node-X resolves to a private address on the compose network; localhost stands in for
            # it here (resolved for real: loopback, refused by the rule for chain endpoints)
            url = peer.url.replace(urlsplit(peer.url).hostname, "localhost")
            EndpointGuard(url, allow_private=configured_rule).check()
            with pytest.raises(EndpointRefused):
                EndpointGuard(url, allow_private=chain_rule).check()
    with pytest.raises(EndpointRefused):
        check_url("http://172.29.0.5:8000", allow_private=False)  # a literal private address alike


def test_only_the_node_web_servers_publish_a_port():
    publishing = {name for name, s in SERVICES.items() if s.get("ports")}
    assert publishing == {"node-a", "node-b", "node-c"}
    for name in publishing:
        assert all(str(p).endswith(":8000") for p in SERVICES[name]["ports"])
    for name, service in SERVICES.items():  # internal networks cannot carry published ports
        if name not in publishing:
            assert all(NETWORKS.get(n, {}).get("internal") for n in _networks(service)), name


def test_each_organization_has_its_own_database_user_and_database():
    users = {}
    for name, service in NODE_SERVICES.items():
        url = urlsplit(service["environment"]["DATABASE_URL"])
        org = _org_of(name, service)
        assert url.username == f"defl_{org}" and url.username != "root", f"{name} connects as {url.username}"
        assert url.path == f"/defl_{org}"
        assert url.password == f"${{ORG_{org.upper()}_DB_PASSWORD}}", f"{name}: the password comes from .env"
        users.setdefault(org, set()).add(url.username)
    assert sorted(users) == list(ORGS) and len({u for s in users.values() for u in s}) == len(ORGS)
    mariadb = SERVICES["mariadb"]["environment"]
    assert mariadb["DEFL_ORGS"].split() == list(ORGS)
    for org in ORGS:
        assert mariadb[f"ORG_{org.upper()}_DB_PASSWORD"].startswith(f"${{ORG_{org.upper()}_DB_PASSWORD:?")


def test_each_organization_has_its_own_password_protected_redis():
    for name, service in NODE_SERVICES.items():
        org = _org_of(name, service)
        url = urlsplit(service["environment"]["CELERY_BROKER_URL"])
        assert url.hostname == f"redis-{org}"
        assert url.password == f"${{ORG_{org.upper()}_REDIS_PASSWORD}}", (
            f"{name} uses Redis without a password"
        )
        assert f"org-{org}" in _networks(service)
    for org in ORGS:
        redis = SERVICES[f"redis-{org}"]
        assert redis["environment"]["REDIS_PASSWORD"].startswith(f"${{ORG_{org.upper()}_REDIS_PASSWORD:?")
        assert "requirepass" in " ".join(_command(redis))
        assert _networks(redis) == [f"org-{org}"] and NETWORKS[f"org-{org}"]["internal"] is True
        members = {n for n, s in SERVICES.items() if f"org-{org}" in _networks(s)}
        assert all(n.endswith(f"-{org}") or n == "deploy" and org == "a" for n in members), members


def test_no_service_runs_with_the_insecure_secret_opt_in():
    for name, service in NODE_SERVICES.items():
        assert "DEFL_ALLOW_INSECURE_SECRET" not in service["environment"], name
        assert service["environment"]["DJANGO_SECRET_KEY"].startswith("${ORG_"), name


def test_every_web_server_migrates_its_database_before_serving():
    for org in ORGS:
        script = _command(SERVICES[f"node-{org}"])[-1]
        assert script.startswith("python manage.py migrate --noinput && exec gunicorn backend.wsgi")


# -------------------------------------------------------------- the init script and Redis, for real


@pytest.mark.integration
def test_the_mariadb_init_script_creates_users_confined_to_their_own_database():
    MySQLdb = pytest.importorskip("MySQLdb")
    run = secrets.token_hex(3)
    orgs = [f"h3t{run}x", f"h3t{run}y"]
    passwords = {org: f"pw'{secrets.token_urlsafe(8)}\\end" for org in orgs}  # quote and backslash
    env = {
        **os.environ,
        "DEFL_ORGS": " ".join(orgs),
        "MARIADB_CLIENT": "mariadb -h127.0.0.1 -P3306 -uroot",
        "MARIADB_ROOT_PASSWORD": "",
        **{f"ORG_{org.upper()}_DB_PASSWORD": pw for org, pw in passwords.items()},
    }
    root = MySQLdb.connect(host="127.0.0.1", port=3306, user="root")
    try:
        subprocess.run(["bash", str(ROOT / "deploy" / "mariadb-init.sh")], env=env, check=True, timeout=60)
        mine, theirs = orgs
        own = MySQLdb.connect(host="127.0.0.1", port=3306, user=f"defl_{mine}", passwd=passwords[mine])
        cursor = own.cursor()
        cursor.execute(f"CREATE TABLE `defl_{mine}`.t (x INT)")  # its own database: full use
        cursor.execute(f"INSERT INTO `defl_{mine}`.t VALUES (1)")
        for statement in (f"SELECT 1 FROM `defl_{theirs}`.dummy", f"CREATE TABLE `defl_{theirs}`.t (x INT)"):
            with pytest.raises(MySQLdb.OperationalError) as refused:
                cursor.execute(statement)
            assert refused.value.args[0] in (1044, 1142), refused.value  # access denied
        with pytest.raises(MySQLdb.OperationalError):
            MySQLdb.connect(host="127.0.0.1", port=3306, user=f"defl_{mine}", passwd="wrong")
        own.close()
        # Idempotent: a second run changes nothing and fails on nothing.
        subprocess.run(["bash", str(ROOT / "deploy" / "mariadb-init.sh")], env=env, check=True, timeout=60)
        missing = {**env, f"ORG_{mine.upper()}_DB_PASSWORD": ""}
        refused_run = subprocess.run(
            ["bash", str(ROOT / "deploy" / "mariadb-init.sh")], env=missing, capture_output=True, text=True
        )
        assert refused_run.returncode != 0 and "is not set" in refused_run.stderr
    finally:
        cursor = root.cursor()
        for org in orgs:
            cursor.execute(f"DROP DATABASE IF EXISTS `defl_{org}`")
            cursor.execute(f"DROP USER IF EXISTS 'defl_{org}'@'%'")
        root.close()


@pytest.mark.integration
def test_the_redis_command_requires_the_password_and_keeps_it_out_of_argv():
    from devnet.anvil import free_port

    port = free_port()
    password = secrets.token_urlsafe(16)
    script = _command(SERVICES["redis-a"])[-1].replace("$$", "$")
    script = script.replace("redis-server -", f"redis-server - --port {port} --bind 127.0.0.1")
    server = subprocess.Popen(
        ["sh", "-c", script],
        env={**os.environ, "REDIS_PASSWORD": password},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        client = ["redis-cli", "-p", str(port), "--no-auth-warning"]
        for _ in range(100):
            reply = subprocess.run([*client, "PING"], capture_output=True, text=True).stdout
            if reply.strip():
                break
            time.sleep(0.1)
        assert "NOAUTH" in reply, reply
        assert subprocess.run(
            [*client, "-a", password, "PING"], capture_output=True, text=True
        ).stdout.strip() == ("PONG")
        processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert password not in processes
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(10)
