"""Defaults of the jobs app's settings, used when backend/settings.py does not define them.

Environment variables (read here so backend/settings.py stays the other engineers' file):
``DEFL_AGENT_INTERVAL`` (agent tick, seconds), ``DEFL_AGENT_POLL`` (head check, seconds), ``DEFL_ATTACK`` (test hook: this node's trainer
attacks, e.g. ``label_flip``), ``DEFL_PROPOSER_FALLBACK_S``, ``DEFL_ACTION_LEASE_S``,
``DEFL_ACTION_RETRY_S``.
"""

from __future__ import annotations

import os

from django.conf import settings

DEFAULTS = {
    "DEFL_AGENT_INTERVAL": float(os.environ.get("DEFL_AGENT_INTERVAL", "0.5")),
    # How often the agent checks the chain's head between full ticks (a new block triggers one).
    "DEFL_AGENT_POLL": float(os.environ.get("DEFL_AGENT_POLL", "0.05")),
    "DEFL_ATTACK": os.environ.get("DEFL_ATTACK", ""),
    "DEFL_PROPOSER_FALLBACK_S": float(os.environ.get("DEFL_PROPOSER_FALLBACK_S", "20")),
    "DEFL_ACTION_LEASE_S": float(os.environ.get("DEFL_ACTION_LEASE_S", "600")),
    "DEFL_ACTION_RETRY_S": float(os.environ.get("DEFL_ACTION_RETRY_S", "5")),
}


def apply_defaults() -> None:
    for name, value in DEFAULTS.items():
        if not hasattr(settings, name):
            setattr(settings, name, value)
