#!/usr/bin/env python
"""Django's command-line entry point for a DeFL node."""

import os
import sys


def _asks_for_help(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv[1:]) or argv[1:2] == ["help"]


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.settings")
    if _asks_for_help(sys.argv):
        # Usage reads no secret: `manage.py node adduser --help` works before a node is configured
        # (a node without DJANGO_SECRET_KEY otherwise refuses to load its settings at all).
        os.environ.setdefault("DEFL_ALLOW_INSECURE_SECRET", "1")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
