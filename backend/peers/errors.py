"""The errors of a peer request's authentication.

A peer view answers them itself (``guard.peer_signed``), before the request reaches an app;
``http_status`` says what each means to the caller (a plain int, like the other families).
"""

from __future__ import annotations


class SignatureError(Exception):
    """A peer request is unsigned, badly signed, stale or replayed."""

    http_status = 401


class UnregisteredSigner(SignatureError):
    """A peer request is validly signed by a key that is not a registered node."""

    http_status = 403
