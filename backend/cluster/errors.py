"""The error a task (and the round action it runs) raises when it cannot be carried out now."""

from __future__ import annotations


class ActionError(Exception):
    """An action cannot be carried out now; its message says why (it is retried later)."""
