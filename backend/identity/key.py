"""This node's key: the one secp256k1 key that signs transactions and peer requests.

The key comes from the environment (``DEFL_NODE_KEY``, a hex private key) or from an
encrypted keystore file (``DEFL_KEYSTORE_PATH`` + ``DEFL_KEYSTORE_PASSWORD``, the
Ethereum V3 keystore format), never from the repository.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_keys import keys


class NodeKeyError(RuntimeError):
    """The node key is missing or cannot be decrypted."""


def create_keystore(path: str | Path, password: str, private_key: str | None = None) -> LocalAccount:
    """Write an encrypted keystore for a new (or imported) key; refuses to overwrite one."""
    if not password:
        raise NodeKeyError("a keystore password is required (DEFL_KEYSTORE_PASSWORD)")
    path = Path(path)
    if path.exists():
        raise NodeKeyError(f"{path} exists already; refusing to overwrite a node key")
    account = Account.from_key(private_key) if private_key else Account.create()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(Account.encrypt(account.key, password)))
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return account


def account_from_settings(key: str, keystore_path: str, password: str) -> LocalAccount:
    if key:
        try:
            return Account.from_key(key)
        except Exception as exc:  # eth-account raises several types for a bad key
            raise NodeKeyError("DEFL_NODE_KEY is not a valid secp256k1 private key") from exc
    path = Path(keystore_path)
    if not path.exists():
        raise NodeKeyError(
            f"no node key: set DEFL_NODE_KEY or create a keystore at {path} (manage.py node init)"
        )
    try:
        return Account.from_key(Account.decrypt(json.loads(path.read_text()), password))
    except ValueError as exc:
        raise NodeKeyError(f"cannot decrypt {path}: wrong DEFL_KEYSTORE_PASSWORD?") from exc


@lru_cache(maxsize=1)
def node_account() -> LocalAccount:
    """This node's account, loaded once per process from the settings."""
    return account_from_settings(
        settings.DEFL_NODE_KEY, settings.DEFL_KEYSTORE_PATH, settings.DEFL_KEYSTORE_PASSWORD
    )


def public_key_bytes(account: LocalAccount) -> bytes:
    """The 64-byte uncompressed secp256k1 public key (no 0x04 prefix), as NodeRegistry stores it."""
    return keys.PrivateKey(account.key).public_key.to_bytes()
