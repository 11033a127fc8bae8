"""deploy/organization/compose.yml: one organization of a consortium on its own host (issue 38).

No Docker engine runs here: the file is checked as `docker compose config` would, and for what
this project requires of it: the validator is this organization's own and its node talks to it
alone; only the web port and the validator's devp2p port are published; no development RPC; the
other organizations are joined by their bootnodes and endpoints, and those endpoints pass the
private-address rule; the example .env names every variable the file requires.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "deploy" / "organization"
TEXT = (HERE / "compose.yml").read_text()
COMPOSE = yaml.safe_load(TEXT)
SERVICES = COMPOSE["services"]
NETWORKS = COMPOSE["networks"]
NODE = ("web", "worker", "agent", "deploy")
BACKEND_SOURCE = "\n".join(p.read_text() for p in (ROOT / "backend").rglob("*.py"))


def _networks(service: dict) -> list[str]:
    return list(service.get("networks", ["default"]))


def _example_env() -> dict[str, str]:
    values = {}
    for line in (HERE / "org.env.example").read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            values[name.strip()] = value.split("#")[0].strip()
    return values


def test_the_services_are_one_organizations():
    assert set(SERVICES) == {"validator", "mariadb", "redis", "deploy", *NODE}
    for name, service in SERVICES.items():
        image = service.get("image", "")
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image tag"
        for dependency in service.get("depends_on", {}):
            assert dependency in SERVICES
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert source in ("./consortium", "../mariadb-init.sh"), source
            else:
                assert source in COMPOSE["volumes"], source
    assert (ROOT / "deploy" / "mariadb-init.sh").exists()
    assert (ROOT / "deploy" / "validator" / "Dockerfile").exists()
    assert SERVICES["deploy"]["profiles"] == ["founder"]  # only the founding organization deploys


def test_only_the_web_port_and_the_validators_p2p_port_are_published():
    published = {name: s["ports"] for name, s in SERVICES.items() if s.get("ports")}
    assert published == {
        "web": ["${PUBLIC_PORT:-8000}:8000"],
        "validator": ["30303:30303/tcp", "30303:30303/udp"],
    }
    for name in ("mariadb", "redis"):  # internal networks only
        assert all(NETWORKS[n].get("internal") is True for n in _networks(SERVICES[name])), name
    assert NETWORKS["chain"] == {"internal": True}  # the validator's RPC: this organization's only


def test_the_node_talks_to_its_own_validator_and_joins_the_others_by_their_endpoints():
    for name in NODE:
        env = SERVICES[name]["environment"]
        assert urlsplit(env["DEFL_CHAIN_URL"]).hostname == "validator", name
        assert env["DEFL_EVM_VERSION"] == "london"
        assert env["DEFL_PEERS"] == "${PEERS:?set PEERS}"
        assert env["DEFL_NODE_ENDPOINT"].startswith("${PUBLIC_ENDPOINT:?")
        assert "chain" in _networks(SERVICES[name])
        for variable in env:
            assert f'"{variable}"' in BACKEND_SOURCE, f"{name} sets {variable}, which nothing reads"
    for name in ("worker", "agent", "web"):  # they dial the other organizations' nodes
        assert "public" in _networks(SERVICES[name])
    commands = get_commands()
    for name in NODE:
        argv = SERVICES[name]["command"]
        argv = shlex.split(argv[-1]) if argv[0] == "sh" else argv
        if argv[:2] == ["python", "manage.py"]:
            assert argv[2] in commands


def test_the_validator_seals_with_this_organizations_keys_and_boots_from_the_others():
    validator = SERVICES["validator"]
    command = validator["command"]
    assert command[command.index("--unlock") + 1] == "/run/secrets/validator_key"
    assert command[command.index("--bootnodes") + 1].startswith("${BOOTNODES:?")
    assert command[command.index("--extIP") + 1].startswith("${PUBLIC_IP:?")
    assert command[command.index("--gethGenesis") + 1] == "/consortium/genesis.json"
    assert validator["environment"]["CLIQUE_P2P_KEY_FILE"] == "/run/secrets/p2p_key"
    assert set(validator["secrets"]) == {"validator_key", "p2p_key"}
    assert "--dev" not in command and "anvil" not in TEXT and "foundry" not in TEXT


def test_the_example_env_names_every_required_variable_and_no_secret():
    required = set(re.findall(r"\$\{([A-Z_]+):\?", TEXT))
    example = _example_env()
    assert required <= set(example), sorted(required - set(example))
    for name in ("SECRET_KEY", "DB_ROOT_PASSWORD", "DB_PASSWORD", "REDIS_PASSWORD", "NODE_KEY"):
        assert example[name] == "", f"{name} must be the operator's own"
    assert not re.search(r"(KEY|PASSWORD):\s*['\"]?[0-9a-fA-Fx]{16,}", TEXT), "a literal secret"


def test_the_other_organizations_endpoints_pass_the_private_address_rule():
    """PEERS is the operator's list: its endpoints are dialled even on a private address (two
    organizations joined over a VPN); the same endpoint read from the chain alone is refused."""
    import pytest
    from django.test import override_settings

    from backend.peers.endpoints import EndpointGuard, EndpointRefused
    from backend.swarm.factory import allow_private_peers
    from backend.swarm.peers import StaticPeerDirectory, parse_peers

    entries = ["0x" + "b" * 40 + "@http://10.8.0.2:8000", "0x" + "c" * 40 + "@http://localhost:8000"]
    peers = parse_peers(entries)
    with override_settings(DEFL_ALLOW_PRIVATE_PEERS=False):
        rule = allow_private_peers(StaticPeerDirectory(peers))
    assert rule is True
    for peer in peers:
        EndpointGuard(peer.url, allow_private=rule).check()
        with pytest.raises(EndpointRefused):
            EndpointGuard(peer.url, allow_private=False).check()
