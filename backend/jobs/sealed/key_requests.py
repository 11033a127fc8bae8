"""Asking for a key: whom (the trainer, then the job's other participants, which relay it), over
the node-signed peer API, and which holders are not asked for a while (one that failed to answer:
a trainer gone offline). Nothing here checks a key: its reader does, on the blob.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import requests

from backend.jobs.context import NodeContext, PeerAccess
from backend.jobs.driver.memory import SealedMemory
from backend.jobs.models import UpdateKey
from backend.jobs.sealed.envelope import KEY_BYTES
from backend.jobs.sealed.key_release import KeyRefused, answer
from backend.ledger import models as mirror

logger = logging.getLogger(__name__)

KEY_PATH = "/api/jobs/peer/update-key"
MAX_ANSWER_BYTES = 1024
# Holders asked for one key in one call at most (the trainer first, then relays).
MAX_HOLDERS = 32
# A holder that failed to answer is not asked again for this long (a trainer gone offline).
HOLDER_DOWN_S = 10.0
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0


def answers(
    ctx: NodeContext, holders: list[str], job_id: int, round_: int, trainer: str
) -> Iterator[tuple[str, bytes]]:
    """(holder, key bytes) from each of ``holders`` not marked down in the node's memory, asked in
    turn (unchecked). One that refuses is passed over; one that fails to answer is marked down for
    HOLDER_DOWN_S."""
    memory = ctx.memory.sealed
    for holder in holders:
        if is_down(memory, holder, time.monotonic()):
            continue
        try:
            key = bytes.fromhex(ask_peer(ctx.peers, holder, job_id, round_, trainer))
        except (KeyRefused, LookupError):
            continue
        except (requests.RequestException, ValueError, TypeError):
            mark_down(memory, holder)
            continue
        yield holder, key


def is_down(memory: SealedMemory, holder: str, now: float) -> bool:
    with memory.lock:
        return memory.down.get(holder, 0.0) > now


def mark_down(memory: SealedMemory, holder: str, now: float | None = None) -> None:
    with memory.lock:
        memory.down[holder] = (time.monotonic() if now is None else now) + HOLDER_DOWN_S


def holders(ctx: NodeContext, job_id: int, trainer: str, participants: list[str] | None = None) -> list[str]:
    """Whom to ask: the trainer, then the job's other participants (relays), never this node.

    ``participants``: the job's (``job_participants``), where the caller read them already."""
    others = job_participants(job_id) if participants is None else participants
    ordered = [trainer] + [n for n in others if n.lower() != trainer.lower()]
    return [n for n in ordered if n.lower() != ctx.address.lower()][:MAX_HOLDERS]


def job_participants(job_id: int) -> list[str]:
    """The job's participants in their on-chain order."""
    return list(
        mirror.Participant.objects.filter(job__job_id=job_id).order_by("index").values_list("node", flat=True)
    )


def ask(ctx: NodeContext, holder: str, job_id: int, round_: int, trainer: str) -> bytes | None:
    """``holder``'s key of the update, or None (refused, unreachable, malformed)."""
    now = time.monotonic()
    if is_down(ctx.memory.sealed, holder, now):
        return None
    try:
        if UpdateKey.objects.filter(node=holder).exists():
            # Several node identities in one database (the in-process tests): the holder is asked
            # directly, through the same decision its endpoint makes.
            text = answer(ctx, holder, ctx.address, job_id, round_, trainer)
        else:
            text = ask_peer(ctx.peers, holder, job_id, round_, trainer)
        key = bytes.fromhex(text)
        if len(key) != KEY_BYTES:
            raise ValueError(f"a key of {len(key)} bytes")
        return key
    except KeyRefused as exc:
        logger.debug("%s refused the key: %s", holder, exc)
    except LookupError as exc:  # no endpoint: nothing was dialled
        logger.debug("not asking %s: %s", holder, exc)
    except (requests.RequestException, ValueError, TypeError) as exc:
        logger.info("asking %s for a key failed: %s", holder, exc)
        mark_down(ctx.memory.sealed, holder, now)
    return None


def ask_peer(peers: PeerAccess, holder: str, job_id: int, round_: int, trainer: str) -> str:
    """POST a key request signed by this node (``peers``) to ``holder``'s endpoint; the hex key, or
    an exception."""
    base = peers.endpoint(holder)
    body = json.dumps({"job": job_id, "round": round_, "trainer": trainer}).encode()
    headers = peers.signed_headers(base, KEY_PATH, body, receiver=holder)
    headers["Content-Type"] = "application/json"
    with requests.post(
        base + KEY_PATH,
        data=body,
        headers=headers,
        timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
        allow_redirects=False,
        stream=True,
    ) as response:
        raw = response.raw.read(MAX_ANSWER_BYTES + 1, decode_content=False)
        if len(raw) > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer larger than {MAX_ANSWER_BYTES} bytes")
        detail = json.loads(raw or b"{}")
        if response.status_code != 200:
            raise KeyRefused(response.status_code, str(detail.get("detail", ""))[:200])
        key = detail.get("key")
        if not isinstance(key, str):
            raise ValueError("an answer without a key")
        return key
