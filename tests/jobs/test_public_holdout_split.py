"""A dataset that declared its hold-out public has one hold-out for every job; others split per job."""

from types import SimpleNamespace

import numpy as np

from backend.jobs.config import DPConfig, JobConfig
from backend.jobs.driver import workspace
from backend.jobs.driver.memory import DriverMemory


def _config(**changes) -> JobConfig:
    base = dict(
        name="j",
        model="mlp",
        input_shape=(1, 8, 8),
        num_classes=10,
        schema_hash="ab" * 32,
        rounds=1,
        dp=DPConfig(mode="none"),
    )
    return JobConfig(**(base | changes))


def _validation_rows(monkeypatch, *, public: bool, config: JobConfig) -> set[int]:
    x = np.arange(500, dtype=np.float32).reshape(500, 1, 1, 1) * np.ones((1, 1, 8, 8), np.float32)
    y = np.arange(500) % 10
    monkeypatch.setattr("backend.datasets.services.load_dataset_arrays", lambda dataset: (x, y))
    dataset = SimpleNamespace(content_hash="cd" * 32, public_holdout=public)
    node = SimpleNamespace(memory=DriverMemory())  # a fresh node: nothing cached
    _, val = workspace.local_split(node, dataset, config)
    return {int(v) for v in val.x[:, 0, 0, 0]}


def test_a_public_holdout_is_the_same_records_whatever_the_job(monkeypatch):
    jobs = [_config(seed=1), _config(seed=2, val_fraction=0.5)]
    public = [_validation_rows(monkeypatch, public=True, config=c) for c in jobs]
    assert public[0] == public[1] and len(public[0]) == 100  # the fixed 20%
    private = [_validation_rows(monkeypatch, public=False, config=c) for c in jobs]
    assert private[0] != private[1]  # other datasets: the job's own split
