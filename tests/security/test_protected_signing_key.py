"""The audit signing key is Visor's own file: no tool call may name it.

Whoever reads the private key can sign a rewritten log; whoever replaces the
public key beside it can make a forged checkpoint verify. Both are refused
like the audit log and the approval directory, through a real `visor run`.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from tests.conftest import RECORDER, VisorProcess
from visor.approval.protected import Protected, signing_key_dir, signing_key_files
from visor.audit.signing import generate


def test_the_key_named_and_the_default_key_folder_are_protected(tmp_path: Path) -> None:
    key = tmp_path / "elsewhere" / "team.key"
    prot = Protected.of([signing_key_dir()], signing_key_files(str(key)))
    assert prot.named_by({"path": str(key)}) == str(key)
    assert prot.named_by({"path": str(key.with_suffix(".pub"))})
    assert prot.named_by({"cmd": f"cat {shlex.quote(str(key))}.bak"})
    assert prot.named_by({"path": str(Path(os.environ["VISOR_HOME"]) / "keys" / "x.key")})
    assert prot.named_by({"path": str(tmp_path / "elsewhere" / "notes.txt")}) is None
    assert signing_key_files(None) == []


@pytest.mark.parametrize("which", ["private", "public", "default_dir", "relative"])
def test_a_tool_call_naming_the_signing_key_is_denied(tmp_path: Path, which: str) -> None:
    keys = generate(tmp_path / "keys")
    received = tmp_path / "received.jsonl"
    named = {
        "private": str(keys.private),
        "public": f"file://{keys.public}",
        "default_dir": str(Path(os.environ["VISOR_HOME"]) / "keys" / "audit-signing.key"),
        "relative": "keys/audit-signing.key",
    }[which]
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        visor_args=["--server-name", "rec", "--signing-key", str(keys.private)],
        env={"RECORDER_LOG": str(received)},
        cwd=tmp_path,
    )
    try:
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"p": named}},
            }
        )
        answer = vp.recv(timeout=60)
    finally:
        vp.kill()
    assert answer["result"]["isError"] is True, answer
    assert "visor.protected_path" in answer["result"]["content"][0]["text"]
    assert named.encode() not in (received.read_bytes() if received.exists() else b"")
