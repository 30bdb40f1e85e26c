"""Signed checkpoints: keygen, the writer's checkpoint records, `visor audit verify --key`.

Real keys, real files written and fsync'd by the real writer; every tampering
is made the way an attacker with write access would (hashes recomputed so the
keyless chain still verifies) and must be caught with its own message.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.audit.helpers import allow
from visor.audit.record import GENESIS, canonical_body, chain_hash, parse_line
from visor.audit.signing import (
    KeyPair,
    SigningError,
    checkpoint_message,
    generate,
    load_public_key,
    load_signer,
)
from visor.audit.writer import AuditWriter

ROOT = Path(__file__).resolve().parents[2]


def visor(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "visor", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


@pytest.fixture
def keys(tmp_path: Path) -> KeyPair:
    return generate(tmp_path / "keys")


@pytest.fixture
def other_keys(tmp_path: Path) -> KeyPair:
    return generate(tmp_path / "other-keys")


def signed_log(path: Path, key: Path, n: int, *, every: int = 4, session: str = "s1", **kw: Any) -> None:
    """One session of `n` allows with a checkpoint every `every` records, closed cleanly."""

    async def run() -> None:
        w = AuditWriter.open(path, session=session, signer=load_signer(key, every=every, seconds=0), **kw)
        try:
            for i in range(n):
                await w.commit(allow(i))
        finally:
            await w.close()

    asyncio.run(run())


def records(path: Path) -> list[dict[str, Any]]:
    return [parse_line(line).record for line in path.read_bytes().splitlines()]


def rechain(recs: list[dict[str, Any]]) -> bytes:
    """What an attacker writes after editing records: every hash and prev recomputed."""
    out = []
    prev = GENESIS if recs[0]["seq"] == 0 else recs[0]["prev"]
    for r in recs:
        body_fields = {k: v for k, v in r.items() if k != "hash"}
        body_fields["prev"] = prev
        body = canonical_body(body_fields)
        digest = chain_hash(prev, body)
        out.append(b'{"hash":"' + digest.encode() + b'",' + body[1:] + b"\n")
        prev = digest
    return b"".join(out)


def verify(path: Path, *pubs: Path) -> subprocess.CompletedProcess[str]:
    args = ["audit", "verify", str(path)]
    for p in pubs:
        args += ["--key", str(p)]
    return visor(*args)


# ------------------------------------------------------------------ keygen


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = visor("audit", "keygen", env={"VISOR_HOME": str(home)})
    assert out.returncode == 0, out.stderr
    private, public = home / "keys" / "audit-signing.key", home / "keys" / "audit-signing.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "keys").stat().st_mode) == 0o700
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert b"PRIVATE KEY" in private.read_bytes() and b"PUBLIC KEY" in public.read_bytes()
    # The public key is printed, with its fingerprint, for keeping elsewhere.
    assert public.read_text() in out.stdout
    assert f"fingerprint: {load_public_key(public).key_id}" in out.stdout
    assert "--signing-key" in out.stderr and "--key" in out.stderr
    # Never overwrites: the old key would no longer verify the logs it signed.
    before = private.read_bytes()
    again = visor("audit", "keygen", env={"VISOR_HOME": str(home)})
    assert again.returncode == 1 and "already exists" in again.stderr
    assert private.read_bytes() == before


def test_keygen_out_creates_missing_folders_0700(tmp_path: Path) -> None:
    out = visor("audit", "keygen", "--out", str(tmp_path / "a" / "b"), "--name", "laptop")
    assert out.returncode == 0, out.stderr
    for d in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "b" / "laptop.key").stat().st_mode) == 0o600
    assert (tmp_path / "a" / "b" / "laptop.pub").is_file()


def test_a_key_others_can_read_is_refused(keys: KeyPair) -> None:
    os.chmod(keys.private, 0o640)
    with pytest.raises(SigningError, match=r"permissions 0640 let others read it.*chmod 600"):
        load_signer(keys.private, every=10, seconds=0)


def test_keys_given_the_wrong_way_round_are_refused(keys: KeyPair, tmp_path: Path) -> None:
    with pytest.raises(SigningError, match="this is a public key; --signing-key takes the private key"):
        load_signer(keys.public, every=10, seconds=0)
    with pytest.raises(SigningError, match="this is a private key; verify with the public key"):
        load_public_key(keys.private)
    junk = tmp_path / "junk.pub"
    junk.write_text("not a key\n")
    with pytest.raises(SigningError, match="not a PEM public key"):
        load_public_key(junk)


def test_a_passphrase_protected_key_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    path = tmp_path / "enc.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        )
    )
    os.chmod(path, 0o600)
    with pytest.raises(SigningError, match="encrypted with a passphrase"):
        load_signer(path, every=10, seconds=0)


def test_a_configured_key_without_cryptography_stops_visor_run(keys: KeyPair, tmp_path: Path) -> None:
    # `cryptography` made unimportable, as in an install without the 'sign' extra.
    script = textwrap.dedent(
        f"""
        import sys
        for name in ("cryptography", "cryptography.hazmat", "cryptography.hazmat.primitives"):
            sys.modules[name] = None
        from visor.cli import main
        sys.exit(main(["run", "--signing-key", {str(keys.private)!r}, "--audit-log",
                       {str(tmp_path / "a.jsonl")!r}, "--", sys.executable, "-c", "pass"]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        stdin=subprocess.PIPE,
    )
    assert out.returncode == 1, out.stderr
    assert "'cryptography' package, which is not installed" in out.stderr
    assert "'sign' extra" in out.stderr
    assert not (tmp_path / "a.jsonl").exists()  # refused before anything was logged unsigned


# ------------------------------------------------------------ the writer


def test_checkpoints_by_count_and_at_close_verify(keys: KeyPair, tmp_path: Path) -> None:
    log = tmp_path / "fs.jsonl"
    signed_log(log, keys.private, 10, every=4)
    recs = records(log)
    cps = [r for r in recs if r["event"] == "checkpoint"]
    # audit_open + 10 allows: a checkpoint after each 4 records, then one at close.
    assert [c["reason"] for c in cps] == ["interval", "interval", "close"]
    assert recs[-1]["event"] == "checkpoint" and recs[-1]["reason"] == "close"
    for c in cps:
        assert c["key"] == keys.key_id and c["log"] == "fs.jsonl" and len(c["sig"]) == 128
        # It signs its own position in the chain.
        pub = load_public_key(keys.public)
        assert pub.verifies(bytes.fromhex(c["sig"]), checkpoint_message(c))
    out = verify(log, keys.public)
    assert out.returncode == 0, out.stdout
    last = recs[-1]
    assert (
        f"signed: 3 checkpoint(s) by key {keys.key_id[:16]}, last at seq {last['seq']} "
        f"({last['ts']}, close, hash {last['hash']}); 0 record(s) after it unsigned" in out.stdout
    )
    # Without --key the checkpoints are chained records like any other.
    plain = verify(log)
    assert plain.returncode == 0 and "signed:" not in plain.stdout


def test_a_checkpoint_by_time(keys: KeyPair, tmp_path: Path) -> None:
    log = tmp_path / "t.jsonl"
    w = AuditWriter.open(log, session="s", signer=load_signer(keys.private, every=0, seconds=0.2))
    try:
        w.append(allow(1))
        deadline = time.monotonic() + 30
        while b'"reason":"time"' not in log.read_bytes():
            assert time.monotonic() < deadline, "no time checkpoint was written"
            time.sleep(0.05)
    finally:
        w.close_sync()
    reasons = [r.get("reason") for r in records(log) if r["event"] == "checkpoint"]
    assert reasons[0] == "time" and reasons[-1] == "close"
    assert verify(log, keys.public).returncode == 0


def test_rotated_files_each_end_signed(keys: KeyPair, tmp_path: Path) -> None:
    log = tmp_path / "r.jsonl"
    signed_log(log, keys.private, 30, every=1000, max_bytes=2000)
    rotated = sorted(
        (p for p in tmp_path.glob("r.jsonl.*") if p.suffix[1:].isdigit()),
        key=lambda p: int(p.suffix[1:]),
    )
    assert len(rotated) >= 2
    for f in rotated:
        assert records(f)[-1]["reason"] == "rotate"
        alone = verify(f, keys.public)  # a rotated file on its own ends signed too
        assert alone.returncode == 0, alone.stdout
    out = verify(log, keys.public)
    assert out.returncode == 0, out.stdout
    assert f"{len(rotated) + 1} file(s)" in out.stdout


def test_a_live_writer_tail_is_not_signed_yet(keys: KeyPair, tmp_path: Path) -> None:
    log = tmp_path / "live.jsonl"
    w = AuditWriter.open(log, session="s", signer=load_signer(keys.private, every=3, seconds=0))
    try:

        async def commit() -> None:
            for i in range(4):
                await w.commit(allow(i))

        asyncio.run(commit())
        out = verify(log, keys.public)
        assert out.returncode == 0, out.stdout
        assert "2 record(s) not signed yet: a Visor is writing this log" in out.stdout
    finally:
        w.close_sync()


def test_a_crashed_session_is_signed_by_the_next_and_said_so(keys: KeyPair, tmp_path: Path) -> None:
    log = tmp_path / "c.jsonl"
    crash = textwrap.dedent(
        f"""
        import asyncio, os
        from tests.audit.helpers import allow
        from visor.audit.signing import load_signer
        from visor.audit.writer import AuditWriter
        async def main():
            w = AuditWriter.open({str(log)!r}, session="crashed",
                                 signer=load_signer({str(keys.private)!r}, every=4, seconds=0))
            for i in range(6):
                await w.commit(allow(i))
            os._exit(0)  # no close: no close checkpoint
        asyncio.run(main())
        """
    )
    subprocess.run([sys.executable, "-c", crash], check=True, timeout=60, cwd=ROOT)
    crashed = verify(log, keys.public)
    assert crashed.returncode == 1
    assert (
        "3 record(s) after the last checkpoint (seq 4) are unsigned and no Visor is writing" in crashed.stdout
    )
    signed_log(log, keys.private, 2, session="next")
    out = verify(log, keys.public)
    assert out.returncode == 0, out.stdout
    assert (
        "3 record(s) written by sessions that did not close cleanly were signed only by a later session"
        in (out.stdout)
    )


# ------------------------------------------------------------- tampering


@pytest.fixture
def log(keys: KeyPair, tmp_path: Path) -> Path:
    path = tmp_path / "fs.jsonl"
    signed_log(path, keys.private, 10, every=4)
    return path


def test_a_flipped_byte_is_caught(log: Path, keys: KeyPair) -> None:
    data = bytearray(log.read_bytes())
    at = data.index(b"secret-value")
    data[at] ^= 0x01
    log.write_bytes(bytes(data))
    out = verify(log, keys.public)
    assert out.returncode == 1
    assert "FAIL" in out.stdout and ":2: hash does not match the line's content (edited)" in out.stdout


def test_a_cut_tail_is_caught(log: Path, keys: KeyPair) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    # audit_open, 3 allows, checkpoint 4, 4 allows, checkpoint 9, 3 allows, close 13: cut the last two.
    assert [r["seq"] for r in records(log) if r["event"] == "checkpoint"] == [4, 9, 13]
    log.write_bytes(b"".join(lines[:-2]))
    out = verify(log, keys.public)
    assert out.returncode == 1
    assert "2 record(s) after the last checkpoint (seq 9) are unsigned and no Visor is writing" in out.stdout
    assert "last at seq 9" in out.stdout  # the last signed position is still reported


def test_a_tail_cut_at_a_checkpoint_is_caught(log: Path, keys: KeyPair) -> None:
    recs = records(log)
    last_interval = max(r["seq"] for r in recs if r.get("reason") == "interval")
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[: last_interval + 1]))
    out = verify(log, keys.public)
    assert out.returncode == 1
    assert f"ends at the checkpoint at seq {last_interval} (interval), not at the close checkpoint" in (
        out.stdout
    )


def test_a_tail_rewritten_with_recomputed_hashes_is_caught(log: Path, keys: KeyPair) -> None:
    recs = records(log)
    recs[7]["args"] = {"path": "/innocent.txt"}  # an allow before the close checkpoint
    log.write_bytes(rechain(recs))
    assert verify(log).returncode == 0  # the keyless chain cannot see it
    out = verify(log, keys.public)
    assert out.returncode == 1
    assert (
        "checkpoint signature does not match: this record or a record before it was rewritten" in out.stdout
    )
    first_after = min(r["seq"] for r in recs if r["event"] == "checkpoint" and r["seq"] > 7)
    assert f"fs.jsonl:{first_after + 1}: checkpoint" in out.stdout  # the first checkpoint after the edit


def test_a_tail_rewritten_without_its_checkpoints_is_caught(log: Path, keys: KeyPair) -> None:
    recs = [r for r in records(log) if not (r["event"] == "checkpoint" and r["seq"] > 6)]
    for i, r in enumerate(recs):
        r["seq"] = i
    log.write_bytes(rechain(recs))
    assert verify(log).returncode == 0
    out = verify(log, keys.public)
    assert out.returncode == 1 and "are unsigned and no Visor is writing this log" in out.stdout


def test_a_replaced_signature_is_caught(log: Path, keys: KeyPair, other_keys: KeyPair) -> None:
    recs = records(log)
    cp = next(r for r in recs if r["event"] == "checkpoint")
    forger = load_signer(other_keys.private, every=1, seconds=0)
    forged = forger.checkpoint(log="fs.jsonl", seq=cp["seq"], prev=cp["prev"], ts=cp["ts"], reason="interval")
    cp["sig"] = forged["sig"]  # a valid signature, by another key, under the real key's name
    log.write_bytes(rechain(recs))
    out = verify(log, keys.public)
    assert out.returncode == 1
    assert f":{cp['seq'] + 1}: checkpoint signature does not match" in out.stdout


def test_a_checkpoint_by_another_key_is_caught(log: Path, keys: KeyPair, other_keys: KeyPair) -> None:
    recs = records(log)
    cp = next(r for r in recs if r["event"] == "checkpoint")
    forger = load_signer(other_keys.private, every=1, seconds=0)
    cp.update(
        forger.checkpoint(log="fs.jsonl", seq=cp["seq"], prev=cp["prev"], ts=cp["ts"], reason="interval")
    )
    log.write_bytes(rechain(recs))
    out = verify(log, keys.public)
    assert out.returncode == 1
    assert (
        f"checkpoint signed by key {other_keys.key_id[:16]}, not by the key given ({keys.key_id[:16]})"
        in (out.stdout)
    )


def test_the_wrong_key_is_caught(log: Path, other_keys: KeyPair, keys: KeyPair) -> None:
    out = verify(log, other_keys.public)
    assert out.returncode == 1
    assert (
        f"checkpoint signed by key {keys.key_id[:16]}, not by the key given ({other_keys.key_id[:16]})"
        in (out.stdout)
    )
    # Both keys given (a rotated key): accepted.
    assert verify(log, other_keys.public, keys.public).returncode == 0


def test_a_log_renamed_or_swapped_is_caught(log: Path, keys: KeyPair) -> None:
    swapped = log.with_name("mail.jsonl")
    swapped.write_bytes(log.read_bytes())
    out = verify(swapped, keys.public)
    assert out.returncode == 1
    assert "checkpoint signed for the log 'fs.jsonl', but this log is 'mail.jsonl'" in out.stdout


def test_an_unsigned_log_fails_with_a_key(tmp_path: Path, keys: KeyPair) -> None:
    plain = tmp_path / "plain.jsonl"

    async def run() -> None:
        w = AuditWriter.open(plain, session="s")
        await w.commit(allow(1))
        await w.close()

    asyncio.run(run())
    assert verify(plain).returncode == 0
    out = verify(plain, keys.public)
    assert out.returncode == 1
    assert "no checkpoint signed by the key given: nothing in this log is signed" in out.stdout


def test_verify_refuses_an_unusable_key(log: Path, keys: KeyPair) -> None:
    out = verify(log, keys.private)
    assert out.returncode == 2 and "this is a private key" in out.stderr


def test_checkpoint_message_is_the_documented_bytes() -> None:
    fields = {
        "event": "checkpoint",
        "key": "ab" * 32,
        "log": "fs.jsonl",
        "prev": "cd" * 32,
        "reason": "close",
        "seq": 12,
        "ts": "2026-05-04T09:30:00.123456Z",
        "sig": "00" * 64,
        "session": "s",
    }
    expected = b"visor-audit-checkpoint-v1\n" + orjson.dumps(
        {
            "key": "ab" * 32,
            "log": "fs.jsonl",
            "prev": "cd" * 32,
            "reason": "close",
            "seq": 12,
            "ts": "2026-05-04T09:30:00.123456Z",
        }
    )
    assert checkpoint_message(fields) == expected


def test_the_review_pack_states_and_checks_the_signatures(
    log: Path, keys: KeyPair, other_keys: KeyPair
) -> None:
    unchecked = visor("report", str(log))
    assert unchecked.returncode == 0, unchecked.stderr
    assert "Signed checkpoints in the window: 3; their signatures were not checked" in unchecked.stdout
    checked = visor("report", str(log), "--key", str(keys.public))
    assert "Chain integrity (whole log, not only the window): verifies" in checked.stdout
    assert "signed: 3 checkpoint(s)" in checked.stdout
    wrong = visor("report", str(log), "--key", str(other_keys.public))
    assert "Chain integrity (whole log, not only the window): DOES NOT VERIFY" in wrong.stdout
    assert "not by the key given" in wrong.stdout


def test_the_review_pack_of_an_unsigned_log_says_so(tmp_path: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    w = AuditWriter.open(plain, session="s")
    w.append(allow(1))
    w.close_sync()
    out = visor("report", str(plain))
    assert "Signed checkpoints: none (the logs were written without `--signing-key`)" in out.stdout


def test_the_documented_checkpoint_verifier_agrees(log: Path, keys: KeyPair, tmp_path: Path) -> None:
    import re

    doc = (ROOT / "docs" / "audit-format.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", doc.split("<!-- checkpoint-verifier -->", 1)[1], re.S)
    assert code is not None
    script = tmp_path / "verify_checkpoints.py"
    script.write_text(code.group(1), encoding="utf-8")

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-I", str(script), str(keys.public), str(log)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = run()
    assert ok.returncode == 0, ok.stderr
    last = records(log)[-1]
    assert (
        ok.stdout.strip() == f"OK last checkpoint ({last['seq']}, 'close', 'fs.jsonl'), 0 record(s) after it"
    )
    recs = records(log)
    cp = next(r for r in recs if r["event"] == "checkpoint")
    cp["sig"] = ("0" if cp["sig"][0] != "0" else "1") + cp["sig"][1:]
    log.write_bytes(rechain(recs))
    bad = run()
    assert bad.returncode != 0 and "InvalidSignature" in bad.stderr


def test_a_rotation_right_after_an_interval_checkpoint_still_ends_the_file_signed(
    keys: KeyPair, tmp_path: Path
) -> None:
    log = tmp_path / "x.jsonl"
    # Every record triggers an interval checkpoint, and every record reaches the size limit.
    signed_log(log, keys.private, 3, every=1, max_bytes=1)
    rotated = [p for p in tmp_path.glob("x.jsonl.*") if p.suffix[1:].isdigit()]
    assert rotated
    for f in rotated:
        assert records(f)[-1]["reason"] == "rotate"
        assert verify(f, keys.public).returncode == 0
    assert verify(log, keys.public).returncode == 0
