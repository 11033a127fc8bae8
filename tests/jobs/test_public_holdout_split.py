"""A dataset that declared its hold-out public has one hold-out for every job; others split per
job. Either way each record's side is keyed with the dataset's secret: one record more moves no
other record, and another secret splits the same records otherwise."""

from types import SimpleNamespace

import numpy as np

from backend.datasets.commitment import new_secret
from backend.datasets.formats import CanonicalDataset
from backend.jobs.driver import workspace
from backend.jobs.driver.memory import DriverMemory
from fl_node.job.config import DPConfig, JobConfig


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


def _validation_rows(
    monkeypatch, *, public: bool, config: JobConfig, secret: str, rows: int = 500
) -> set[int]:
    x = np.arange(rows, dtype=np.float32).reshape(rows, 1, 1, 1) * np.ones((1, 1, 8, 8), np.float32)
    y = np.arange(rows) % 10
    canonical = CanonicalDataset(x, y, tuple(str(i) for i in range(10)))
    monkeypatch.setattr("backend.datasets.services.load_canonical", lambda dataset: canonical)
    dataset = SimpleNamespace(pk=1, secret=secret, public_holdout=public)
    node = SimpleNamespace(memory=DriverMemory())  # a fresh node: nothing cached
    _, val = workspace.local_split(node, dataset, config)
    return {int(v) for v in val.x[:, 0, 0, 0]}


def test_a_public_holdout_is_the_same_records_whatever_the_job(monkeypatch):
    secret = new_secret()
    jobs = [_config(seed=1), _config(seed=2, val_fraction=0.5)]
    public = [_validation_rows(monkeypatch, public=True, config=c, secret=secret) for c in jobs]
    assert public[0] == public[1] and 60 < len(public[0]) < 140  # the fixed 20%, record by record
    private = [_validation_rows(monkeypatch, public=False, config=c, secret=secret) for c in jobs]
    assert private[0] != private[1]  # other datasets: the job's own split


def test_one_record_more_moves_no_other_record_and_the_secret_decides(monkeypatch):
    secret = new_secret()
    for public in (True, False):
        smaller = _validation_rows(
            monkeypatch, public=public, config=_config(seed=3), secret=secret, rows=499
        )
        larger = _validation_rows(monkeypatch, public=public, config=_config(seed=3), secret=secret, rows=500)
        assert larger - {499} == smaller
    other = _validation_rows(monkeypatch, public=False, config=_config(seed=3), secret=new_secret())
    assert other != _validation_rows(monkeypatch, public=False, config=_config(seed=3), secret=secret)
