"""Optional ed25519 signatures over a pack's manifest (which holds the sha256 of every other entry).

Keys: the private key is a PEM file (PKCS#8, unencrypted); a trusted public key is a PEM file, an OpenSSH
``ssh-ed25519`` line, or the raw 32-byte key in base64 or hex. Needs the ``cryptography`` package
(``pip install kernelsmith[sign]``); without it, asking to sign or check raises a clear error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from kernel_cache.errors import KeyFileError, PackError, SigningUnavailableError

ALGORITHM = "ed25519"


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SigningUnavailableError(
            "signing needs the 'cryptography' package: pip install 'kernelsmith[sign]' (or pip install cryptography)"
        ) from None
    return serialization, ed25519


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


def _public_raw(public_key: Any) -> bytes:
    serialization, _ = _crypto()
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def generate_keypair(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write a new private key to ``path`` (mode 0600) and its public key to ``path.pub``; refuse to overwrite."""
    serialization, ed25519 = _crypto()
    priv_path, pub_path = Path(path), Path(str(path) + ".pub")
    for p in (priv_path, pub_path):
        if p.exists():
            raise PackError(f"{p} exists; refusing to overwrite a key. Choose another path.")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv_path, pub_path


def load_private_key(path: str | os.PathLike[str]) -> Any:
    serialization, ed25519 = _crypto()
    if not Path(path).is_file():
        raise KeyFileError(f"signing key not found: {path}")
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise KeyFileError(f"cannot read signing key {path}: {e.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise KeyFileError(f"{path} is not an ed25519 key; generate one with `kernelsmith pack keygen`")
    return key


def load_public_key(spec: str | os.PathLike[str]) -> Any:
    """A trusted key from a file (PEM or OpenSSH) or given inline as base64/hex of the raw 32 bytes."""
    serialization, ed25519 = _crypto()
    p = Path(spec)
    is_file = p.is_file()
    try:
        raw = p.read_bytes().strip() if is_file else str(spec).strip().encode()
    except OSError as e:
        raise KeyFileError(f"cannot read trusted key {spec}: {e.strerror}") from None
    if b"PRIVATE KEY-----" in raw:
        raise KeyFileError(f"trusted key {spec} is a private key: give its public key ({spec}.pub from "
                           "`kernelsmith pack keygen`)")
    try:
        if raw.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(raw)
        elif raw.startswith(b"ssh-ed25519"):
            key = serialization.load_ssh_public_key(raw)
        else:
            text = raw.decode()
            try:
                data = bytes.fromhex(text)
            except ValueError:
                data = base64.b64decode(text, validate=True)
            key = ed25519.Ed25519PublicKey.from_public_bytes(data)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as e:
        if not is_file:  # neither a file nor a key written inline: most likely a mistyped path
            raise KeyFileError(f"trusted key file not found: {spec} (nor is it an inline base64 or hex ed25519 "
                               "public key)") from None
        raise KeyFileError(f"trusted key {spec}: not an ed25519 public key (PEM, ssh-ed25519, base64 or hex): "
                           f"{e}") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise KeyFileError(f"trusted key {spec} is not an ed25519 key")
    return key


def sign_manifest(manifest: bytes, private_key_path: str | os.PathLike[str]) -> bytes:
    """The ``manifest.sig`` entry: JSON naming the algorithm and key id, with the base64 signature."""
    key = load_private_key(private_key_path)
    sig = key.sign(manifest)
    doc = {"algorithm": ALGORITHM, "key_id": key_id(_public_raw(key.public_key())),
           "signature": base64.b64encode(sig).decode()}
    return json.dumps(doc, indent=1).encode()


def signature_key_id(sig_entry: bytes) -> str | None:
    try:
        return str(json.loads(sig_entry).get("key_id"))
    except (ValueError, AttributeError):
        return None


def check_signature(manifest: bytes, sig_entry: bytes, trusted: list[Any]) -> str | None:
    """None when one of the trusted keys signed ``manifest``; otherwise the reason it is not trusted."""
    from cryptography.exceptions import InvalidSignature

    try:
        doc = json.loads(sig_entry)
        if doc.get("algorithm") != ALGORITHM:
            return f"signature algorithm {doc.get('algorithm')!r} is not {ALGORITHM}"
        sig = base64.b64decode(doc["signature"], validate=True)
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        return "manifest.sig is malformed"
    for key in trusted:
        try:
            key.verify(sig, manifest)
            return None
        except InvalidSignature:
            continue
    ids = ", ".join(key_id(_public_raw(k)) for k in trusted)
    return f"the signature (key {doc.get('key_id')}) does not verify with any trusted key ({ids})"
