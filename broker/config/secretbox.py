"""Sealing secrets at rest: AES-256-GCM (the `cryptography` library) under CLAWQ_SECRET_KEY.

A sealed value is `<key id>:<base64(nonce || ciphertext)>`; the key id says which key
opens it, so keys rotate: seal with the current key, keep the retired ones
(`CLAWQ_SECRET_KEYS_RETIRED`) to open what they sealed. The associated data ties a sealed
value to its owner (a custom tool's id): moved to another row, it does not open. A value
that does not open is an error, never an empty secret.
"""

from __future__ import annotations

import base64
import binascii
import os

from broker.config.settings import Settings
from broker.errors import ConfigurationError

NONCE_BYTES = 12


class SecretError(ConfigurationError):
    """A secret cannot be sealed or opened; the message says why (never the secret)."""


def _key(raw: str, name: str) -> bytes:
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise SecretError(f"{name} is not base64") from None
    if len(key) != 32:
        raise SecretError(f"{name} must be 32 bytes (base64 of 32 random bytes), not {len(key)}")
    return key


class SecretBox:
    def __init__(self, current_id: str, keys: dict[str, bytes]) -> None:
        self.current_id = current_id
        self.keys = keys

    @classmethod
    def from_settings(cls, settings: Settings) -> SecretBox:
        keys = {
            kid: _key(raw, f"CLAWQ_SECRET_KEYS_RETIRED[{kid}]")
            for kid, raw in settings.secret_keys_retired.items()
        }
        if settings.secret_key:
            keys[settings.secret_key_id] = _key(settings.secret_key, "CLAWQ_SECRET_KEY")
        return cls(settings.secret_key_id if settings.secret_key else "", keys)

    def seal(self, plaintext: bytes, associated: bytes) -> str:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if not self.current_id:
            raise SecretError("set CLAWQ_SECRET_KEY (base64 of 32 random bytes) to store secrets")
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self.keys[self.current_id]).encrypt(nonce, plaintext, associated)
        return f"{self.current_id}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, sealed: str, associated: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        kid, _, data = sealed.partition(":")
        if kid not in self.keys:
            raise SecretError(f"the secrets were sealed with key '{kid}', which this process lacks")
        try:
            raw = base64.b64decode(data, validate=True)
            return AESGCM(self.keys[kid]).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], associated)
        except (InvalidTag, binascii.Error, ValueError):
            raise SecretError(
                f"the secrets do not open with key '{kid}' (altered, or sealed for another owner)"
            ) from None


def new_key() -> str:
    """A fresh CLAWQ_SECRET_KEY."""
    return base64.b64encode(os.urandom(32)).decode()
