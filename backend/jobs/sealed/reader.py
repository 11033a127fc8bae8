"""Reading a sealed update: its blob, opened with a key from this node's rows, an offer gathered
ahead (key_gathering), or its holders asked now (key_requests); the key kept once it opens the blob.
"""

from __future__ import annotations

import logging

from backend.jobs import blobs
from backend.jobs.context import NodeContext
from backend.jobs.driver.state import ActionError
from backend.jobs.models import UpdateKey
from backend.jobs.sealed import key_requests
from backend.jobs.sealed.envelope import OVERHEAD, KeyMismatch, SealError, WrongContent, unseal
from backend.jobs.sealed.key_gathering import take_offer
from backend.jobs.sealed.key_release import KeyRefused
from backend.jobs.sealed.key_store import keep, same_update

logger = logging.getLogger(__name__)


class KeyUnavailable(ActionError):
    """No key for the update yet: not released, or no holder answered (retried later)."""


def read_update(
    ctx: NodeContext, job_id: int, round_: int, update, *, max_bytes: int, ask: bool = True
) -> bytes:
    """The plaintext of ``update`` (a mirror Update row), at most ``max_bytes`` encoded.

    The sealed blob is fetched first (cached: a prefetch may have it already). The key comes from
    this node's own rows, else (``ask``) from the trainer, else from any participant that relays
    it; a key other than the one the blob commits to is that holder's error, and the next holder
    is asked. KeyUnavailable when none gave the committed key yet; WrongContent (a BlobMismatch)
    when the blob is not a sealed update or the committed key does not open it to the content hash
    on chain: the trainer's fault, final, the same verdict on every node.
    """
    blob = blobs.get(ctx, update.reference, max_bytes=max_bytes + OVERHEAD)
    held = UpdateKey.objects.filter(
        node=ctx.address, job_id=job_id, round=round_, trainer=update.trainer
    ).first()
    if held is not None and same_update(held, update):
        return unseal(blob, bytes.fromhex(held.key), update.content_hash)
    offered = take_offer(ctx, job_id, round_, update)
    if offered is not None:  # gathered (gather_keys), unchecked until now
        try:
            plaintext = unseal(blob, offered, update.content_hash)
        except KeyMismatch as exc:  # a holder's wrong answer: the holders are asked below
            logger.warning("an offered key of %s's update is not the committed one: %s", update.trainer, exc)
        else:  # WrongContent propagates: the committed key opens it wrong, the trainer's fault
            keep(ctx, job_id, round_, update, offered)
            return plaintext
    if not ask:
        raise KeyUnavailable(f"no key of {update.trainer}'s update yet")
    for holder in key_requests.holders(ctx, job_id, update.trainer):
        key = key_requests.ask(ctx, holder, job_id, round_, update.trainer)
        if key is None:
            continue
        try:
            plaintext = unseal(blob, key, update.content_hash)
        except KeyMismatch as exc:  # not the committed key: that holder is hostile or confused
            logger.warning("key of %s's update from %s refused: %s", update.trainer, holder, exc)
            continue
        keep(ctx, job_id, round_, update, key)
        return plaintext
    raise KeyUnavailable(f"no participant gave the key of {update.trainer}'s update in round {round_}")


def fetch_key(
    ctx: NodeContext,
    holders: list[str],
    job_id: int,
    round_: int,
    trainer: str,
    reference: str,
    content_hash: str,
    *,
    max_bytes: int,
) -> bytes | None:
    """A checked key of the update from the first of ``holders`` that gives one over the peer
    API, or None. Writes nothing to this node's database (a background thread's part, see
    driver/prefetch.py: the caller keeps the key with ``keep``)."""
    blob = blobs.get(ctx, reference, max_bytes=max_bytes + OVERHEAD)
    memory = ctx.memory.sealed
    for holder, key in key_requests.answers(ctx, holders, job_id, round_, trainer):
        try:
            unseal(blob, key, content_hash)
            return key
        except WrongContent:
            return key  # the committed key: its verdict (the trainer's fault) is every node's
        except (KeyRefused, SealError, LookupError):
            continue
        except (ValueError, TypeError):
            key_requests.mark_down(memory, holder)
    return None
