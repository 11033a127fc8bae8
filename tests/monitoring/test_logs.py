"""Structured logs: JSON lines naming the node, and the job, round and action they belong to."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from backend.cluster import runner
from backend.telemetry.logs import (
    ContextFilter,
    TextFormatter,
    action_context,
    json_formatter,
    logging_config,
)


@pytest.fixture
def lines():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(json_formatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.mark.django_db(transaction=True)
def test_an_actions_lines_name_it_down_to_its_training_thread(lines, settings):
    from backend.identity.key import node_account

    log = logging.getLogger("backend.test.action")

    def training():
        log.info("a local step")
        return threading.get_ident()

    with action_context(job=7, round=3, action="train"):
        log.info("training begins")
        thread = runner.run(7, 3, training)
    log.info("between actions")
    found = {line["message"]: line for line in lines()}
    assert thread != threading.get_ident()  # the step ran on the runner's own thread
    for message in ("training begins", "a local step"):
        line = found[message]
        assert (line["job"], line["round"], line["action"]) == (7, 3, "train"), line
        assert line["node"] == node_account().address and line["level"] == "INFO" and line["time"]
    assert (found["between actions"]["job"], found["between actions"]["action"]) == (None, None)


def test_text_lines_carry_the_same_context():
    record = logging.LogRecord("backend.x", logging.WARNING, __file__, 1, "round stalled", None, None)
    with action_context(job=2, round=5, action="score"):
        ContextFilter().filter(record)
    assert "[job=2 round=5 action=score]: round stalled" in TextFormatter().format(record)


def test_an_unknown_log_format_is_refused():
    with pytest.raises(ValueError, match="DEFL_LOG_FORMAT must be json or text"):
        logging_config("xml", "INFO")
