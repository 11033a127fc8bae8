"""Compiled contract artifacts (contracts/artifacts/, written by contracts/compile.mjs).

The contracts are compiled once per EVM target (hardfork): a chain at an earlier hardfork runs
only code compiled for it (london has no PUSH0, MCOPY or transient storage). The default
target's artifacts are contracts/artifacts/<Contract>.json, each other's
contracts/artifacts/<target>/<Contract>.json. The ABI is the same for every target; a
deployment names its target (``DEFL_EVM_VERSION``) and only its bytecode is read from there.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import NamedTuple

from eth_typing import ABIElement

ARTIFACTS_DIR = Path(__file__).resolve().parents[2] / "contracts" / "artifacts"
CONTRACT_NAMES = ("NodeRegistry", "DataRegistry", "JobLogic", "FederatedLearning", "CommitteeRuleHarness")
# Keep in step with contracts/compile.mjs (TARGETS, DEFAULT_TARGET).
DEFAULT_EVM_VERSION = "cancun"
EVM_VERSIONS = ("cancun", "shanghai", "london")


class Artifact(NamedTuple):
    name: str
    abi: list[ABIElement]
    bytecode: bytes
    # the runtime code, immutables left as 32 zero bytes each (backend/ledger/upgrade.py compares it)
    deployed_bytecode: bytes = b""


class UnknownEvmVersion(ValueError):
    """A target the contracts are not compiled for (the ledger's errors import this module: a
    ValueError, turned into LedgerConfigError where a deployment is made)."""


def check_evm_version(evm_version: str) -> str:
    """``evm_version`` if the contracts are compiled for it; UnknownEvmVersion (one sentence) if not."""
    if evm_version not in EVM_VERSIONS:
        raise UnknownEvmVersion(
            f"EVM version {evm_version!r} is not one the contracts are compiled for "
            f"({', '.join(EVM_VERSIONS)})"
        )
    return evm_version


@cache
def load_artifact(name: str, evm_version: str = DEFAULT_EVM_VERSION) -> Artifact:
    directory = (
        ARTIFACTS_DIR
        if check_evm_version(evm_version) == DEFAULT_EVM_VERSION
        else ARTIFACTS_DIR / evm_version
    )
    data = json.loads((directory / f"{name}.json").read_text())
    return Artifact(
        name=name,
        abi=data["abi"],
        bytecode=bytes.fromhex(data["bytecode"].removeprefix("0x")),
        deployed_bytecode=bytes.fromhex(data.get("deployedBytecode", "0x").removeprefix("0x")),
    )


def all_artifacts() -> tuple[Artifact, ...]:
    return tuple(load_artifact(name) for name in CONTRACT_NAMES)
