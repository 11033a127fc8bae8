"""The sealed envelope of an update: AES-256-GCM under a fresh random key, never derived from
anything public, made key-committing. Sealed blob:
``MAGIC | commitment (32) | nonce (12) | ciphertext | tag (16)``, the commitment SHA-256 of a
label and the 32-byte key, authenticated with the ciphertext (associated data).

AES-GCM alone does not commit to its key: a trainer could build one blob that opens to a good
update under the key it gives the scorers and to other bytes under the key it gives everyone
else. Here the blob names its one key, and the blob itself is fixed by its swarm reference on
chain, so exactly one key is accepted for it, by every node: a key that is not the committed
one is the HOLDER's fault (KeyMismatch: ask another holder), and the committed key opening the
blob to nothing, or to bytes other than the content hash on chain, is provably the TRAINER's
(WrongContent: the update is rejected, the same way on every node).
"""

from __future__ import annotations

import hashlib
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from backend.jobs import blobs
from fl_node.codec import OwnedBuffer
from fl_node.codec import content_hash as hash_of

MAGIC = b"DFS2"
KEY_BYTES = 32
COMMITMENT_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
HEADER_BYTES = len(MAGIC) + COMMITMENT_BYTES  # authenticated with the ciphertext
# a sealed blob is this much larger than its update
OVERHEAD = HEADER_BYTES + NONCE_BYTES + TAG_BYTES
_COMMITMENT_LABEL = b"defl sealed update key v2:"


class SealError(blobs.BlobMismatch):
    """A sealed blob that is malformed, or does not open under a key to its recorded hash."""


class KeyMismatch(SealError):
    """The key is not the one the blob commits to: whoever offered it is wrong, not the trainer."""


class WrongContent(SealError):
    """The key the blob commits to does not open it, or opens it to bytes other than the content
    hash on chain. The blob (fixed by its reference on chain) names its one key, so this is the
    trainer's own submission at fault: a copied blob under a hash of its own, or one made to
    mislead. Every node that reads it reaches the same verdict."""


def key_commitment(key: bytes) -> bytes:
    """What a sealed blob carries to commit to its key: SHA-256 of a label and the key."""
    return hashlib.sha256(_COMMITMENT_LABEL + bytes(key)).digest()


def seal(plaintext: bytes) -> tuple[bytes, bytes]:
    """(sealed blob, key): a fresh random key and nonce for every update."""
    key = AESGCM.generate_key(bit_length=8 * KEY_BYTES)
    nonce = os.urandom(NONCE_BYTES)
    header = MAGIC + key_commitment(key)
    return header + nonce + AESGCM(key).encrypt(nonce, plaintext, header), key


def unseal(blob: bytes, key: bytes, expected_hash: str | bytes) -> bytes:
    """The update inside ``blob``, if ``key`` opens it and it hashes to ``expected_hash`` (else SealError).

    ``expected_hash``: hex (with or without 0x), or the 32 raw bytes of an event's bytes32.
    """
    if isinstance(expected_hash, bytes | bytearray):
        expected_hash = bytes(expected_hash).hex()
    if len(key) != KEY_BYTES:
        raise KeyMismatch(f"a key has {KEY_BYTES} bytes, not {len(key)}")
    if len(blob) < OVERHEAD or not blob.startswith(MAGIC):
        raise WrongContent("not a sealed update")
    if bytes(blob[len(MAGIC) : HEADER_BYTES]) != key_commitment(key):
        raise KeyMismatch("the key is not the one the sealed update commits to")
    if isinstance(blob, OwnedBuffer):  # a large blob of the caller's own (backend.jobs.blobs.get)
        return _unseal_in_place(blob, key, expected_hash.removeprefix("0x").lower())
    header = bytes(blob[:HEADER_BYTES])
    nonce = blob[HEADER_BYTES : HEADER_BYTES + NONCE_BYTES]
    try:
        plaintext = AESGCM(key).decrypt(nonce, blob[HEADER_BYTES + NONCE_BYTES :], header)
    except InvalidTag:
        raise WrongContent("the sealed update does not open under the key it commits to") from None
    if hash_of(plaintext) != expected_hash.removeprefix("0x").lower():
        raise WrongContent("the sealed update does not hash to its recorded content hash")
    return plaintext


_SLICE_BYTES = 1 << 20


def _unseal_in_place(blob: OwnedBuffer, key: bytes, expected_hash: str) -> OwnedBuffer:
    """unseal() of a blob the caller owns, in memory bounded by a slice: the same blob, now the update.

    A first pass decrypts slice by slice into a scratch buffer to check the tag and the
    plaintext's hash, leaving the blob as it was;
    the second decrypts it in place; then the seal's header and tag are cut off (no copy).
    """
    head, end = HEADER_BYTES + NONCE_BYTES, len(blob) - TAG_BYTES
    header, nonce, tag = bytes(blob[:HEADER_BYTES]), bytes(blob[HEADER_BYTES:head]), bytes(blob[end:])
    scratch = bytearray(_SLICE_BYTES + 16)  # update_into wants a block's room to spare
    digest = hashlib.sha256()
    with memoryview(blob) as whole, memoryview(scratch) as out:
        for in_place in (False, True):
            decryptor = Cipher(algorithms.AES(key), modes.GCM(nonce, tag)).decryptor()
            decryptor.authenticate_additional_data(header)
            for start in range(head, end, _SLICE_BYTES):
                with whole[start : min(start + _SLICE_BYTES, end)] as piece:
                    size = decryptor.update_into(piece, out)
                    if size != len(piece):  # GCM is a stream mode
                        raise SealError("the cipher did not decrypt a slice whole")
                    if in_place:
                        piece[:] = out[:size]
                    else:
                        digest.update(out[:size])
            try:
                decryptor.finalize()
            except InvalidTag:
                raise WrongContent("the sealed update does not open under the key it commits to") from None
            if not in_place and digest.hexdigest() != expected_hash:
                raise WrongContent("the sealed update does not hash to its recorded content hash")
    del blob[end:]
    del blob[:head]
    return blob
