"""The committed ABI + bytecode artifacts are what the pinned compiler makes of the sources."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# Compiles every contract for every EVM target (minutes on 2 cores); `make lint` runs the same
# check (`node contracts/compile.mjs --check`), and `make test` both.
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_artifacts_match_sources():
    result = subprocess.run(
        ["node", "contracts/compile.mjs", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compiler_is_pinned():
    package = json.loads((ROOT / "package.json").read_text())
    assert package["devDependencies"]["solc"] == "0.8.37"
    artifact = json.loads((ROOT / "contracts/artifacts/FederatedLearning.json").read_text())
    assert artifact["compiler"]["solc"].startswith("0.8.37")
    assert artifact["compiler"]["settings"]["optimizer"]["enabled"] is True
