"""Ed25519 keys and the signed checkpoint records of the audit chain.

A hash chain without a key cannot show that its tail was rewritten with
recomputed hashes. A checkpoint is a chained record (event ``checkpoint``)
whose ``sig`` is an Ed25519 signature over the chain position it stands at:
its own ``seq``, its ``prev`` (the hash of every record before it, through the
chain), its ``ts``, the ``log`` it was written to and the ``key`` fingerprint.
Rewriting any record before a checkpoint changes that ``prev``, and only the
holder of the private key can sign the new one.

The message signed is the domain tag ``visor-audit-checkpoint-v1`` and a
newline, then the canonical JSON (sorted keys, no spaces, UTF-8) of
``{"key", "log", "prev", "reason", "seq", "ts"}`` exactly as the record holds
them (docs/audit-format.md, "Signed checkpoints").

`cryptography` is an optional dependency (the ``sign`` extra): everything that
needs it imports it here, and its absence with a key configured is an error
that stops Visor, never a silent fallback to an unsigned log.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from visor.audit.paths import visor_home

# A checkpoint every DEFAULT_EVERY records, or DEFAULT_SECONDS after the first record it
# would cover, whichever comes first; and one at every clean close and rotation.
from visor.audit.writer import DEFAULT_EVERY, DEFAULT_SECONDS, AuditError

DOMAIN = b"visor-audit-checkpoint-v1\n"
KEY_NAME = "audit-signing"
REASONS = frozenset({"interval", "time", "rotate", "close"})
SIGNED_FIELDS = ("key", "log", "prev", "reason", "seq", "ts")
_INSTALL_HINT = (
    "install Visor with the 'sign' extra (from a clone: pipx install '.[sign]'), "
    "or add cryptography to the environment Visor runs in"
)


class SigningError(AuditError):
    """A key cannot be made, read or used; the message names the file and the fix."""


def keys_dir() -> Path:
    """Where `visor audit keygen` writes by default; protected from tool calls like the logs."""
    return visor_home() / "keys"


def _crypto() -> Any:
    """The Ed25519 and serialization modules of `cryptography`, or a SigningError saying how to get them."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SigningError(
            f"signed checkpoints need the 'cryptography' package, which is not installed: {_INSTALL_HINT}"
        ) from None
    return ed25519, serialization


def fingerprint(raw_public: bytes) -> str:
    """The key's name in checkpoint records: SHA-256 of its 32 raw bytes, 64 hex digits."""
    return hashlib.sha256(raw_public).hexdigest()


def checkpoint_message(fields: dict[str, Any]) -> bytes:
    """The bytes a checkpoint's signature covers, from the record's own fields."""
    return DOMAIN + orjson.dumps({k: fields.get(k) for k in SIGNED_FIELDS}, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True)
class PublicKey:
    path: Path
    raw: bytes
    key_id: str
    _key: Any

    def verifies(self, signature: bytes, message: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True, slots=True)
class Signer:
    """The private key the writer signs checkpoints with, and how often it does."""

    path: Path
    key_id: str
    every: int  # records; 0 means no count trigger
    seconds: float  # after the first unsigned record; 0 means no time trigger
    _key: Any

    def checkpoint(self, *, log: str, seq: int, prev: str, ts: str, reason: str) -> dict[str, Any]:
        """The checkpoint event for this position (the writer stamps seq, prev and ts to match)."""
        fields = {"key": self.key_id, "log": log, "prev": prev, "reason": reason, "seq": seq, "ts": ts}
        signature = self._key.sign(checkpoint_message(fields))
        return {
            "event": "checkpoint",
            "log": log,
            "key": self.key_id,
            "reason": reason,
            "sig": signature.hex(),
        }


def _read_key_file(path: Path, what: str) -> tuple[bytes, int]:
    """The file's bytes and its permission bits, read from one open file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SigningError(f"{what} {path}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SigningError(f"{what} {path}: not a regular file")
        if st.st_size > 64 * 1024:
            raise SigningError(f"{what} {path}: {st.st_size} bytes is not a key file")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read()
    finally:
        os.close(fd)
    return data, stat.S_IMODE(st.st_mode)


def load_signer(path: str | os.PathLike[str], *, every: int, seconds: float) -> Signer:
    """The private key at `path`, which only its owner may read (like ssh, a wider mode is refused)."""
    path = Path(os.path.expanduser(os.fspath(path)))
    if every < 0 or seconds < 0 or (every == 0 and seconds == 0):
        raise SigningError("checkpoints need a positive record count or number of seconds")
    ed25519, serialization = _crypto()
    data, mode = _read_key_file(path, "signing key")
    if b"PUBLIC KEY" in data and b"PRIVATE KEY" not in data:
        raise SigningError(f"signing key {path}: this is a public key; --signing-key takes the private key")
    if mode & 0o077:
        raise SigningError(
            f"signing key {path}: permissions {mode:04o} let others read it, and whoever "
            f"reads it can sign a rewritten log; run: chmod 600 {path}"
        )
    from cryptography.exceptions import UnsupportedAlgorithm

    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise SigningError(
            f"signing key {path}: it is encrypted with a passphrase, which Visor cannot ask for "
            "(it runs unattended); make an unencrypted key with `visor audit keygen`"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise SigningError(
            f"signing key {path}: not a PEM private key (make one with `visor audit keygen`)"
        ) from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SigningError(f"signing key {path}: a {type(key).__name__}, not an Ed25519 private key")
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return Signer(path=path, key_id=fingerprint(raw), every=every, seconds=seconds, _key=key)


def load_public_key(path: str | os.PathLike[str]) -> PublicKey:
    path = Path(os.path.expanduser(os.fspath(path)))
    ed25519, serialization = _crypto()
    data, _ = _read_key_file(path, "public key")
    if b"PRIVATE KEY" in data:
        raise SigningError(
            f"public key {path}: this is a private key; verify with the public key (the .pub file "
            "`visor audit keygen` wrote), and keep the private key away from the machines that only verify"
        )
    from cryptography.exceptions import UnsupportedAlgorithm

    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise SigningError(
            f"public key {path}: not a PEM public key (the .pub file `visor audit keygen` wrote)"
        ) from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise SigningError(f"public key {path}: a {type(key).__name__}, not an Ed25519 public key")
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PublicKey(path=path, raw=raw, key_id=fingerprint(raw), _key=key)


@dataclass(frozen=True, slots=True)
class KeyPair:
    private: Path
    public: Path
    key_id: str
    public_pem: str


def _ensure_private_dir(folder: Path) -> None:
    """Create `folder` and any missing parents 0700: they hold a private key."""
    missing: list[Path] = []
    probe = folder
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # whatever the umask says


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def generate(out_dir: str | os.PathLike[str] | None = None, name: str = KEY_NAME) -> KeyPair:
    """Write a new key pair: NAME.key (0600) and NAME.pub in `out_dir` (default $VISOR_HOME/keys).

    Never overwrites: a replaced key would no longer verify the logs the old one signed.
    """
    ed25519, serialization = _crypto()
    if not name or "/" in name or name.startswith("."):
        raise SigningError(f"key name {name!r}: a plain file name is needed")
    folder = Path(os.path.abspath(os.path.expanduser(os.fspath(out_dir)))) if out_dir else keys_dir()
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    for p in (private, public):
        if p.exists() or p.is_symlink():
            raise SigningError(
                f"{p} already exists; a new key would not verify the logs the old one signed: "
                "choose another --name or --out, or move the old key away first"
            )
    try:
        _ensure_private_dir(folder)
    except OSError as exc:
        raise SigningError(f"cannot create {folder}: {exc.strerror or exc}") from None
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    try:
        _write_new(private, private_pem, 0o600)
        _write_new(public, public_pem, 0o644)
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise SigningError(f"cannot write the key to {folder}: {exc.strerror or exc}") from None
    return KeyPair(private=private, public=public, key_id=fingerprint(raw), public_pem=public_pem.decode())


def signer_from_args(args: argparse.Namespace) -> Signer | None:
    """The signer `visor run` was given (`--signing-key` or VISOR_SIGNING_KEY), or None."""
    path = getattr(args, "signing_key", None)
    if not path:
        return None
    return load_signer(
        path,
        every=getattr(args, "checkpoint_every", DEFAULT_EVERY),
        seconds=getattr(args, "checkpoint_seconds", DEFAULT_SECONDS),
    )
