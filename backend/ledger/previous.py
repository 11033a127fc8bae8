"""The deployment a consortium upgraded from, read-only: its jobs finish there and stay readable.

After an upgrade (docs/OPERATIONS.md, Upgrades) the contracts file names the new deployment and,
under ``previous``, the one it carried the consortium over from. Nothing is sent to the previous
contracts through this module: it reads their jobs. Their FederatedLearning may speak protocol
version 1 or 2 (versions.SPOKEN_VERSIONS); version 1's ``getJob`` returned fewer fields (no draw:
no reveal count, seed or mix), so a job is decoded by the version the contract states.
"""

from __future__ import annotations

from dataclasses import fields, replace
from functools import cached_property

from eth_utils import to_checksum_address

from .client import ChainClient
from .contracts import FederatedLearning
from .resources import Deployment, JobState, JobStatus, RoundPhase
from .versions import read_version

# getJob's Job struct in protocol version 1 (contracts at 9e773ff), field by field: JobState's
# names; JobState's fields that version 1 lacks (its draw: reveal count, seed, mix; later ones)
# read as zero.
_V1_FIELDS = (
    ("proposer", "address"),
    ("rounds", "uint16"),
    ("round", "uint16"),
    ("committee_size", "uint8"),
    ("top_k", "uint8"),
    ("min_trainers", "uint16"),
    ("status", "uint8"),
    ("phase", "uint8"),
    ("use_blocks", "bool"),
    ("join_deadline", "uint64"),
    ("train_period", "uint32"),
    ("score_period", "uint32"),
    ("update_deadline", "uint64"),
    ("score_deadline", "uint64"),
    ("participant_count", "uint16"),
    ("update_count", "uint16"),
    ("score_count", "uint8"),
    ("commit_count", "uint8"),
    ("max_spend_per_round", "uint64"),
    ("margin", "uint16"),
    ("config_hash", "bytes32"),
    ("model_hash", "bytes32"),
    ("model_ref_digest", "bytes32"),
)
_V1_JOB = "(" + ",".join(abi_type for _, abi_type in _V1_FIELDS) + ")"
_ZERO32 = b"\x00" * 32


class PreviousFederatedLearning:
    """The previous deployment's FederatedLearning, read through the version it speaks."""

    def __init__(self, address: str, client: ChainClient):
        self._contract = FederatedLearning(address, client)
        self.address = self._contract.address
        self.client = client

    @cached_property
    def version(self) -> int | None:
        return read_version(self.client, self.address)

    def job_count(self) -> int:
        return self._contract.job_count()  # jobCount() is the same in every version

    def committee(self, job_id: int) -> list[str]:
        return self._contract.committee(job_id)  # committee(uint256) is the same in every version

    def get_job(self, job_id: int) -> JobState:
        if self.version != 1:
            return self._contract.get_job(job_id)
        call = self._contract.encode("getJob", job_id)._replace(output_types=(_V1_JOB,))
        values = dict(zip((name for name, _ in _V1_FIELDS), self.client.call(call)[0], strict=True))
        values["proposer"] = to_checksum_address(values["proposer"])
        missing = {f.name: _ZERO32 if f.type in ("bytes", bytes) else 0 for f in fields(JobState)}
        state = JobState(**(missing | values | {"job_id": job_id}))
        return replace(state, status=JobStatus(state.status), phase=RoundPhase(state.phase))


class PreviousLedger:
    """Read-only access to the previous deployment's jobs."""

    def __init__(self, client: ChainClient, deployment: Deployment):
        self.client = client
        self.deployment = deployment

    @cached_property
    def fl(self) -> PreviousFederatedLearning:
        return PreviousFederatedLearning(self.deployment.address("FederatedLearning"), self.client)
