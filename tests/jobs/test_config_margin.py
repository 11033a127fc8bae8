"""The margin of another member's job config at its worst values: a config error (the job is
declined), never a crash of the node's discovery."""

from __future__ import annotations

import json

import pytest

from fl_node.job.config import ConfigError, JobConfig
from tests.builders import job_config


@pytest.mark.parametrize("margin", ["x", None, -1, 10_001, 10**30, [1]])
def test_a_hostile_margin_in_a_remote_config_is_a_config_error(margin):
    data = json.loads(job_config().to_bytes())
    data["margin_bp"] = margin
    with pytest.raises(ConfigError):
        JobConfig.from_bytes(json.dumps(data).encode())


def test_the_largest_margin_is_accepted():
    data = json.loads(job_config().to_bytes())
    data["margin_bp"] = 10_000
    assert (
        JobConfig.from_bytes(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).margin_bp
        == 10_000
    )
