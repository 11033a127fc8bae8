"""This node's update keys (``UpdateKey`` rows): its own update's, written before the sealed blob
leaves the node, and every key it checked (it opens the blob to the hash on chain), which it then
reads with and relays to the job's other participants.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError

from backend.jobs import blobs
from backend.jobs.context import NodeContext
from backend.jobs.models import UpdateKey
from backend.jobs.sealed.envelope import seal


def store_own(
    ctx: NodeContext,
    job_id: int,
    round_: int,
    plaintext: bytes,
    content_hash: str,
    *,
    samples: int = 0,
    base_hash: str = "",
    kind: str = "",
    spend: int = 0,
) -> str:
    """Seal this node's update, keep its key, store the sealed blob (pinned); its reference.

    The key row is written before the blob leaves the node. A retried submit of the same update
    reuses the row's blob and key (the reference it may already have sent). ``samples``,
    ``base_hash``, ``kind`` and ``spend`` are kept with it for a retry after a restart
    (``own_unsent``).
    """
    mine: dict[str, Any] = dict(node=ctx.address, job_id=job_id, round=round_, trainer=ctx.address)
    kept = UpdateKey.objects.filter(**mine).first()
    wanted = content_hash.removeprefix("0x").lower()
    if kept is not None and kept.reference and kept.content_hash.removeprefix("0x").lower() == wanted:
        return kept.reference  # stored and pinned by the attempt that wrote the row
    if not plaintext:
        raise ValueError("an update to seal has bytes")
    blob, key = seal(plaintext)
    UpdateKey.objects.update_or_create(
        **mine,
        defaults=dict(
            reference="",
            content_hash="0x" + wanted,
            key=key.hex(),
            own=True,
            samples=samples,
            base_hash=base_hash,
            kind=kind,
            spend=spend,
        ),
    )
    reference = blobs.put(ctx, blob)
    UpdateKey.objects.filter(**mine).update(reference=reference)
    return reference


def own_unsent(ctx: NodeContext, job_id: int, round_: int) -> UpdateKey | None:
    """This node's sealed update of the round, stored (sealed, pinned) by an attempt whose submit
    did not complete; the caller checks the chain has no update of this node for the round."""
    return (
        UpdateKey.objects.filter(node=ctx.address, job_id=job_id, round=round_, trainer=ctx.address, own=True)
        .exclude(reference="")
        .filter(samples__gt=0)
        .first()
    )


def keep(ctx: NodeContext, job_id: int, round_: int, update, key: bytes) -> None:
    """Keep a key checked against ``update`` (a mirror Update row, or any object with its trainer,
    reference and content_hash): this node then reads the update, and relays the key."""
    try:
        UpdateKey.objects.get_or_create(
            node=ctx.address,
            job_id=job_id,
            round=round_,
            trainer=update.trainer,
            defaults=dict(reference=update.reference, content_hash=update.content_hash, key=key.hex()),
        )
    except IntegrityError:  # another worker of this node kept it at the same moment
        pass


def keys_held(node: str, job_id: int, round_: int) -> set[str]:
    """Trainers (lower-case) whose update keys ``node`` holds for the round."""
    return {
        t.lower()
        for t in UpdateKey.objects.filter(node=node, job_id=job_id, round=round_).values_list(
            "trainer", flat=True
        )
    }


def same_update(held: UpdateKey, update) -> bool:
    return (
        held.reference.removeprefix("0x").lower() == update.reference.removeprefix("0x").lower()
        and held.content_hash.removeprefix("0x").lower() == update.content_hash.removeprefix("0x").lower()
    )
