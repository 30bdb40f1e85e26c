"""`visor run --signing-key` end to end: a real server behind a real `visor run`, then `visor audit verify --key`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import RECORDER, VisorProcess, sentinel
from visor.audit.signing import generate


def call(vp: VisorProcess, i: int) -> dict:
    vp.request(
        {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": {"n": i}}}
    )
    return vp.recv(timeout=60)


def verify(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "visor", "audit", "verify", *argv], capture_output=True, text=True, timeout=60
    )


def test_visor_run_with_a_key_writes_checkpoints_that_verify(tmp_path: Path) -> None:
    home = Path(os.environ["VISOR_HOME"])
    keys = generate()  # $VISOR_HOME/keys, as `visor audit keygen` does
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        visor_args=["--server-name", "rec", "--signing-key", str(keys.private), "--checkpoint-every", "5"],
    )
    try:
        vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        assert "tools" in vp.recv(timeout=60)["result"], vp.stderr
        for i in range(8):
            assert not call(vp, i)["result"].get("isError"), vp.stderr
        sentinel(vp)
    finally:
        vp.kill()
    assert vp.proc.returncode == 0, vp.stderr
    log = home / "audit" / "rec.jsonl"
    recs = [json.loads(line) for line in log.read_bytes().splitlines()]
    checkpoints = [r for r in recs if r["event"] == "checkpoint"]
    assert len(checkpoints) >= 3
    assert {c["reason"] for c in checkpoints[:-1]} == {"interval"}
    assert recs[-1]["event"] == "checkpoint" and recs[-1]["reason"] == "close"  # after session_end
    assert recs[-2]["event"] == "session_end"
    assert all(c["key"] == keys.key_id and c["log"] == "rec.jsonl" for c in checkpoints)

    out = verify("--key", str(keys.public))  # every log under $VISOR_HOME/audit/
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"signed: {len(checkpoints)} checkpoint(s)" in out.stdout
    assert f"last at seq {recs[-1]['seq']}" in out.stdout and "0 record(s) after it unsigned" in out.stdout


def test_visor_run_takes_the_key_from_the_environment_and_refuses_a_bad_one(tmp_path: Path) -> None:
    home = Path(os.environ["VISOR_HOME"])
    keys = generate(tmp_path / "k")
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        visor_args=["--server-name", "env"],
        env={"VISOR_SIGNING_KEY": str(keys.private)},
    )
    try:
        assert not call(vp, 1)["result"].get("isError"), vp.stderr
    finally:
        vp.kill()
    assert b'"reason":"close"' in (home / "audit" / "env.jsonl").read_bytes()
    assert verify(str(home / "audit" / "env.jsonl"), "--key", str(keys.public)).returncode == 0

    os.chmod(keys.private, 0o644)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "visor",
            "run",
            "--server-name",
            "bad",
            "--signing-key",
            str(keys.private),
            "--",
            sys.executable,
            str(RECORDER),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert bad.returncode == 1
    assert "permissions 0644 let others read it" in bad.stderr
    assert not (home / "audit" / "bad.jsonl").exists()
