"""Builders the tests share, one definition each: ``from tests.builders import job_config, stored_dataset``.

They make the rows and objects many tests need as a starting point and that no test is about;
a test that is about one of their fields passes it explicitly.
"""

from __future__ import annotations

from backend.datasets.models import BudgetGroup, Dataset
from fl_node.job.config import DPConfig, JobConfig


def job_config(**fields) -> JobConfig:
    """A valid job configuration: an MLP on four features and two classes, two rounds, no DP, the
    defaults for everything else. A test names the fields it is about (``input_shape``, ``dp``,
    ``committee_size``...), which replace these."""
    values: dict = dict(
        name="job",
        model="mlp",
        input_shape=(4,),
        num_classes=2,
        schema_hash="00" * 32,
        rounds=2,
        dp=DPConfig(mode="none"),
    )
    return JobConfig(**(values | fields))


def stored_dataset(
    name: str = "data",
    *,
    content: str = "1",
    epsilon_cap: float = 20.0,
    delta: float = 1e-5,
    num_samples: int = 1000,
    budget_group: BudgetGroup | None = None,
    **fields,
) -> Dataset:
    """A dataset row as an upload leaves it (stored; four features, two classes), written straight
    to this node's database: for the tests of budgets and releases, which need no file, no
    swarm and no chain. ``content`` is one hex digit, repeated into its content hash, so two
    datasets with different digits never share records; ``fields`` overrides any other column."""
    values = dict(
        name=name,
        format="npz",
        num_samples=num_samples,
        feature_shape=[4],
        num_features=4,
        classes=["a", "b"],
        schema_hash="0" * 64,
        content_hash=content * 64,
        size_bytes=1,
        encrypted_reference="",
        status="stored",
        epsilon_cap=epsilon_cap,
        delta=delta,
        budget_group=budget_group,
    )
    return Dataset.objects.create(**(values | fields))
