"""docker-compose.yml stays correct without a Docker engine: structure, references and commands.

No engine runs on the test machines, so the file is checked the way `docker compose config`
would reject it, plus what only this project knows: every variable a node is given is one
the settings read, and every management command the services run exists.
"""

import re
import shlex
from pathlib import Path

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
    for name, service in SERVICES.items():
        for variable in service.get("environment", {}) if service.get("build") else {}:
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
