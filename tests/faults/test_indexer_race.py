"""Two indexers of one MariaDB database on the same blocks: the second finds them stored (a replay).

After a database restart a node's indexers resume together on the same batch; the second used to
insert rows the first had just stored and log "an event was refused (Duplicate entry ...)". The
scenario (indexer_race_scenario.py, a script: Django there runs on a MariaDB database of its own)
holds the first indexer's transaction open until the second is seen waiting, then commits it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration  # the machine's MariaDB (127.0.0.1:3306), a database of its own


@pytest.mark.timeout(600)
def test_a_second_indexer_on_the_same_blocks_stores_and_refuses_nothing(tmp_path):
    command = [sys.executable, "-m", "tests.faults.indexer_race_scenario"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEFL_", "DATABASE_URL", "DJANGO_"))}
    env["DEFL_DATA_DIR"] = str(tmp_path)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["vendor"] == "mysql", report
    assert report["b_waited_for_a"], "the second indexer never overlapped the first: nothing was raced"
    assert report["a_new_events"] == report["logs"] > 0, report
    assert (report["b_new_events"], report["b_rejected"], report["b_error"]) == (0, 0, ""), report
    assert report["warnings"] == [] and report["rejected_events"] == 0, report
    assert report["cursor"] == report["head"], report
