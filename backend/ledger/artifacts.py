"""Compiled contract artifacts (contracts/artifacts/*.json, written by contracts/compile.mjs)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import NamedTuple

from eth_typing import ABIElement

ARTIFACTS_DIR = Path(__file__).resolve().parents[2] / "contracts" / "artifacts"
CONTRACT_NAMES = ("NodeRegistry", "DataRegistry", "FederatedLearning", "CommitteeRuleHarness")


class Artifact(NamedTuple):
    name: str
    abi: list[ABIElement]
    bytecode: bytes


@cache
def load_artifact(name: str) -> Artifact:
    path = ARTIFACTS_DIR / f"{name}.json"
    data = json.loads(path.read_text())
    return Artifact(name=name, abi=data["abi"], bytecode=bytes.fromhex(data["bytecode"].removeprefix("0x")))


def all_artifacts() -> tuple[Artifact, ...]:
    return tuple(load_artifact(name) for name in CONTRACT_NAMES)
