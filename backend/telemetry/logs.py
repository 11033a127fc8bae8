"""Structured logs: every record carries the node, job, round and action it belongs to.

``DEFL_LOG_FORMAT=json`` writes one JSON object per line (python-json-logger) with the fields
``time``, ``level``, ``logger``, ``message``, ``node``, ``job``, ``round``, ``action`` (and
``exc_info`` for an exception); ``text`` (the default) writes the same fields as one readable line.
The job, round and action come from context variables that the round driver sets around each
action it runs (``action_context``), so every line an action logs, down to the ledger and the
swarm store, names them; the cluster runner carries them onto the training thread. The node is
this node's chain address, read once per process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pythonjsonlogger.json import JsonFormatter

_job: ContextVar[int | None] = ContextVar("defl_log_job", default=None)
_round: ContextVar[int | None] = ContextVar("defl_log_round", default=None)
_action: ContextVar[str | None] = ContextVar("defl_log_action", default=None)
CONTEXT_FIELDS = ("node", "job", "round", "action")


@contextmanager
def action_context(*, job: int | None, round: int | None, action: str | None) -> Iterator[None]:  # noqa: A002
    """Log records made inside this block (this thread, or a context copied from it) name these."""
    tokens = (_job.set(job), _round.set(round), _action.set(action))
    try:
        yield
    finally:
        _action.reset(tokens[2])
        _round.reset(tokens[1])
        _job.reset(tokens[0])


def current_context() -> dict[str, Any]:
    return {"job": _job.get(), "round": _round.get(), "action": _action.get()}


class _NodeAddress:
    """This node's chain address, read once (None until a key is configured)."""

    def __init__(self) -> None:
        self.value: str | None = None

    def get(self) -> str | None:
        if self.value is None:
            try:
                from backend.identity.key import node_account

                self.value = node_account().address
            except Exception:  # no key yet (init has not run): the field stays empty
                return None
        return self.value


class ContextFilter(logging.Filter):
    """Adds ``node``, ``job``, ``round`` and ``action`` to every record (None where unknown)."""

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self.node = _NodeAddress()

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node.get()
        for key, value in current_context().items():
            setattr(record, key, value)
        return True


def json_formatter() -> JsonFormatter:
    return JsonFormatter(
        "{asctime}{levelname}{name}{message}{node}{job}{round}{action}",
        style="{",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        timestamp=False,
    )


class TextFormatter(logging.Formatter):
    """One readable line, with the context fields that are set."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(context)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"{key}={getattr(record, key)}"
            for key in CONTEXT_FIELDS[1:]
            if getattr(record, key, None) is not None
        ]
        record.context = (" [" + " ".join(parts) + "]") if parts else ""
        return super().format(record)


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """The LOGGING setting: one stream handler on the root logger, JSON lines or text."""
    if log_format not in ("json", "text"):
        raise ValueError(f"DEFL_LOG_FORMAT must be json or text, not {log_format!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": ContextFilter}},
        "formatters": {
            "json": {"()": json_formatter},
            "text": {"()": TextFormatter},
        },
        "handlers": {
            "console": {"class": "logging.StreamHandler", "filters": ["context"], "formatter": log_format},
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # Django's own loggers write through the root handler, in the same format.
            "django": {"level": "WARNING" if level == "DEBUG" else level, "propagate": True},
            "django.server": {"propagate": True},
        },
    }
