"""A job for data held in this process (the simulator's, a benchmark's): the job's description
of the data (input shape, classes, a stand-in schema hash) taken from the dataset's splits, the
rest of the job as given. The node builds its jobs from a create request instead
(backend/jobs_api/services.py); both are the same JobConfig.
"""

from __future__ import annotations

import hashlib
from typing import Any

from fl_node.data import DatasetSplits
from fl_node.job.config import JobConfig


def job_for(splits: DatasetSplits, model: str, **fields: Any) -> JobConfig:
    """The job training ``model`` on ``splits``; ``fields``: any other JobConfig field.

    ``name`` defaults to the dataset's; a dataset with a vocabulary tells the model its size.
    """
    options = dict(fields.pop("model_options", {}))
    if splits.vocab_size is not None:
        options.setdefault("vocab_size", splits.vocab_size)
    return JobConfig(
        name=fields.pop("name", splits.name),
        model=model,
        input_shape=tuple(splits.input_shape),
        num_classes=splits.num_classes,
        schema_hash=hashlib.sha256(f"defl-sim-schema:{splits.name}".encode()).hexdigest(),
        model_options=options,
        **fields,
    )
